"""Connections to the cluster the suite runs against (libpq environment)."""
import collections
import os
import re
import subprocess
import tempfile
import threading
import time

import psycopg2


def connect(autocommit=True, **kwargs):
    conn = psycopg2.connect("", **kwargs)
    conn.autocommit = autocommit
    return conn


def fresh_database(name):
    """Drops and creates the database `name` with pg_throttle in it; returns
    (a connection to the default database, one to `name`), both autocommit."""
    admin = connect()
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name}")
        cur.execute(f"CREATE DATABASE {name}")
    db = connect(dbname=name)
    with db.cursor() as cur:
        cur.execute("CREATE EXTENSION pg_throttle")
    return admin, db


def event_rows_read(cur):
    """Rows of throttle.event the current transaction read, by sequential
    scans and through its indexes (counts a transaction has not reported
    yet: pg_stat_get_xact_tuples_returned)."""
    cur.execute("SELECT pg_stat_get_xact_tuples_returned('throttle.event'::regclass),"
                "       (SELECT sum(pg_stat_get_xact_tuples_returned(i.indexrelid)) FROM pg_index i"
                "        WHERE i.indrelid = 'throttle.event'::regclass)")
    seq, by_index = cur.fetchone()
    return int(seq) + int(by_index)


def sql_error(conn, statement, params=None):
    """Runs `statement`; returns (sqlstate, message, hint), or None when it succeeds."""
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params)
        return None
    except psycopg2.Error as e:
        diag = e.diag
        return (e.pgcode, diag.message_primary, diag.message_hint)


def pgbench(script, seconds, clients):
    """Runs `script` with pgbench (prepared protocol, 2 threads); returns
    (transactions processed, transactions failed)."""
    with tempfile.NamedTemporaryFile("w", suffix=".pgbench", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        out = subprocess.run(
            ["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", "2",
             "-T", str(seconds), "-f", path],
            check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    processed = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
    failed = re.search(r"number of failed transactions: (\d+)", out)
    return processed, int(failed.group(1)) if failed else 0


def one(conn, sql, params=None):
    """Runs `sql`; returns its first row (None when it returns none)."""
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()


def rows(cur, sql, params=None):
    """Runs `sql` on a cursor; returns all its rows."""
    cur.execute(sql, params)
    return cur.fetchall()


def most_at_once(spans):
    """The most spans (start, end) that share an instant: from a race's log,
    how many held something at once."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                   key=lambda edge: (edge[0], edge[1]))
    now = best = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def drain_race(queue, claim, workers, seconds=120):
    """`workers` threads, each with its own connection, loop on `claim` (a query of
    (queue, worker) returning rows (id, claim_token, key)) and complete what it returns, until
    the queue is empty or `seconds` pass. Returns (log, errors): per claim, its events
    [(id, key)], the instant the claim returned, the instant complete was called, and how many
    events complete changed; the workers' errors."""
    log, errors = [], []
    stop_at = time.monotonic() + seconds

    def work(index):
        conn = connect()
        cur = conn.cursor()
        try:
            while time.monotonic() < stop_at:
                got = rows(cur, claim, (queue, f"w{index}"))
                returned = time.monotonic()
                if not got:
                    if rows(cur, "SELECT count(*) FROM throttle.event WHERE queue = %s",
                            (queue,))[0][0] == 0:
                        return
                    time.sleep(0.005)
                    continue
                time.sleep(0.002)
                completing = time.monotonic()
                done = rows(cur, "SELECT throttle.complete(%s::bigint[], %s)",
                            ([r[0] for r in got], got[0][1]))[0][0]
                log.append(([(r[0], r[2]) for r in got], returned, completing, done))
        except Exception as e:  # noqa: BLE001 - reported as a test failure
            errors.append(f"w{index}: {e}")
        finally:
            conn.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return log, errors


def race_verdict(log, per_event):
    """From a drain_race log: the most claims (per_event: claimed events) that held one key at
    once, and the count of completions per event id (complete changed every event its claim
    held)."""
    spans = collections.defaultdict(list)
    for events, returned, completing, _ in log:
        keys = [k for _, k in events] if per_event else {k for _, k in events}
        for key in keys:
            spans[key].append((returned, completing))
    worst = max((most_at_once(s) for s in spans.values()), default=0)
    completed = collections.Counter(i for events, _, _, done in log if done == len(events)
                                    for i, _ in events)
    return worst, completed


def set_wakeups(admin, on):
    """Turns the wake-ups (pg_throttle.wakeups, a reload setting) on or off with ALTER SYSTEM,
    and waits until a new session sees it and the wakers have had their reload: a test that
    checks what a call NOTIFYs itself, or fires recurring schedules by hand under the test
    clock, runs with them off."""
    cur = admin.cursor()
    cur.execute("ALTER SYSTEM SET pg_throttle.wakeups = %s" % ("on" if on else "off"))
    cur.execute("SELECT pg_reload_conf()")
    for _ in range(100):
        probe = connect()
        seen = one(probe, "SHOW pg_throttle.wakeups")[0]
        probe.close()
        if seen == ("on" if on else "off"):
            break
        time.sleep(0.05)
    time.sleep(0.5)
