"""The version check: every entry point refuses a database without pg_throttle,
or with a version this client does not support, with VersionError."""
import asyncio

import psycopg
import pytest

import pg_throttle


def test_supported_version(conn):
    assert pg_throttle.__version__ == "0.4.0"
    assert "0.4.0" in pg_throttle.SUPPORTED
    assert pg_throttle.check_version(conn) == "0.4.0"


def test_missing_extension(other_database):
    info = other_database()
    with psycopg.connect(info, autocommit=True) as c:
        with pytest.raises(pg_throttle.VersionError) as caught:
            pg_throttle.check_version(c)
        assert caught.value.found is None
        assert caught.value.database == c.info.dbname
        message = str(caught.value)
        assert "not installed" in message and c.info.dbname in message and "CREATE EXTENSION pg_throttle" in message
        # The helpers check on their first call on a connection, before any
        # statement that would fail with "schema throttle does not exist".
        with pytest.raises(pg_throttle.VersionError):
            pg_throttle.schedule(c, "q", "k")
    with pytest.raises(pg_throttle.VersionError):
        pg_throttle.Worker("q", lambda e, ctx: None, conninfo=info).start()
    with pytest.raises(pg_throttle.VersionError):
        with pg_throttle.lease(info, "l", 5):
            pass


def test_wrong_version(other_database):
    info = other_database("0.3.0")
    with psycopg.connect(info, autocommit=True) as c:
        with pytest.raises(pg_throttle.VersionError) as caught:
            pg_throttle.check_version(c)
        assert caught.value.found == "0.3.0"
        assert "0.3.0" in str(caught.value) and "supports extension version 0.4.0" in str(caught.value)
        with pytest.raises(pg_throttle.VersionError):
            pg_throttle.cancel(c, "q", "k")
    limiter = pg_throttle.RateLimiter(psycopg.connect(info, autocommit=True), rate=1)
    with pytest.raises(pg_throttle.VersionError):
        limiter.take("k")
    limiter.source.close()


def test_wrong_version_async(other_database):
    info = other_database("0.3.0")

    async def main():
        async with await psycopg.AsyncConnection.connect(info, autocommit=True) as c:
            with pytest.raises(pg_throttle.VersionError):
                await pg_throttle.check_version_async(c)
    asyncio.run(main())
