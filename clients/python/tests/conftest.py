"""Fixtures: the server comes from the libpq environment (PGHOST, PGPORT,
PGUSER, PGDATABASE), with CREATE EXTENSION pg_throttle done in its database and
a superuser role (pg_throttle.test_clock, release_group, reset and CREATE
DATABASE need one). Every name a test uses carries a random suffix, so that the
suite runs again in the same database."""
import os
import sys
import uuid

import psycopg
import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
try:
    import pg_throttle  # noqa: F401 - installed, or on PYTHONPATH
except ImportError:
    sys.path.insert(0, SRC)
    import pg_throttle  # noqa: F401


def unique(prefix):
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


@pytest.fixture
def conn():
    """A connection in autocommit, for the test's own statements."""
    c = psycopg.connect("", autocommit=True)
    yield c
    c.close()


@pytest.fixture
def name(request):
    """A name no earlier run used: queue, lock or bucket (under 63 bytes)."""
    return unique("pyt." + request.node.name[:30])


@pytest.fixture(scope="session")
def other_database():
    """make(extension_version or None): a new database, without pg_throttle or
    with that version of it; dropped at the end. Its conninfo is returned."""
    made = []
    admin = psycopg.connect("", autocommit=True)

    def make(version=None):
        db = "pyt_" + uuid.uuid4().hex[:12]
        admin.execute(f'CREATE DATABASE "{db}"')
        made.append(db)
        info = f"dbname={db}"
        if version is not None:
            with psycopg.connect(info, autocommit=True) as c:
                c.execute("CREATE EXTENSION pg_throttle VERSION %s" % psycopg.sql.quote(version))
        return info

    yield make
    for db in made:
        admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    admin.close()


@pytest.fixture
def workers():
    """Workers started by a test; stopped (aborting) at its end, whatever happens."""
    started = []

    def start(*args, **kwargs):
        kwargs.setdefault("poll", 0.2)
        worker = pg_throttle.Worker(*args, **kwargs)
        started.append(worker)
        return worker.start()
    yield start
    for worker in started:
        worker.stop(abort=True)
    for worker in started:
        assert worker.error is None, worker.error


def wait_until(predicate, timeout, every=0.02):
    import time
    end = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(every)
