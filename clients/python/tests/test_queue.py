"""schedule, schedule_many, cancel and reschedule, on a fixed clock."""
import datetime

import psycopg
import pytest

import pg_throttle

NOW = datetime.datetime(2026, 3, 1, 9, 0, tzinfo=datetime.timezone.utc)


@pytest.fixture
def clock(conn):
    conn.execute("SET pg_throttle.test_clock = '2026-03-01 09:00:00+00'")
    conn.execute("SET TimeZone = 'UTC'")
    return conn


def row(conn, event_id):
    cur = conn.execute("""SELECT item_key, state, run_at, payload, group_key, priority, max_attempts, concurrency_key
                          FROM throttle.all_events WHERE id = %s""", (event_id,))
    names = [c.name for c in cur.description]
    return dict(zip(names, cur.fetchone()))


def test_schedule(clock, name):
    conn = clock
    now_id = pg_throttle.schedule(conn, name, "now")
    later = pg_throttle.schedule(conn, name, "later", datetime.timedelta(minutes=5), {"user": 42},
                                 group_key="tenant-a", priority=3, max_attempts=2)
    at = pg_throttle.schedule(conn, name, "at", NOW + datetime.timedelta(hours=1), ["a", 1],
                              concurrency_key="k")
    assert row(conn, now_id) == {"item_key": "now", "state": "pending", "run_at": NOW, "payload": {},
                                 "group_key": None, "priority": 0, "max_attempts": 5, "concurrency_key": None}
    assert row(conn, later) == {"item_key": "later", "state": "pending", "run_at": NOW + datetime.timedelta(minutes=5),
                                "payload": {"user": 42}, "group_key": "tenant-a", "priority": 3, "max_attempts": 2,
                                "concurrency_key": None}
    assert row(conn, at)["run_at"] == NOW + datetime.timedelta(hours=1)
    assert row(conn, at)["payload"] == ["a", 1] and row(conn, at)["concurrency_key"] == "k"
    # A pending item_key: replaced (the default), or kept earlier.
    assert pg_throttle.schedule(conn, name, "later", datetime.timedelta(minutes=1), {"v": 2}) == later
    assert row(conn, later)["run_at"] == NOW + datetime.timedelta(minutes=1) and row(conn, later)["payload"] == {"v": 2}
    assert pg_throttle.schedule(conn, name, "later", datetime.timedelta(minutes=9), on_duplicate="keep_earlier") == later
    assert row(conn, later)["run_at"] == NOW + datetime.timedelta(minutes=1)
    with pytest.raises(TypeError):
        pg_throttle.schedule(conn, name, "bad", 5)


def test_schedule_in_the_callers_transaction(name):
    """The helpers neither commit nor roll back: a rolled-back schedule
    schedules nothing, a committed one is there."""
    with psycopg.connect("") as c:          # not autocommit
        pg_throttle.schedule(c, name, "rolled-back")
        c.rollback()
        pg_throttle.schedule(c, name, "committed")
        c.commit()
        keys = c.execute("SELECT item_key FROM throttle.event WHERE queue = %s", (name,)).fetchall()
    assert keys == [("committed",)]


def test_schedule_many(clock, name):
    conn = clock
    assert pg_throttle.schedule_many(conn, name, []) == []
    ids = pg_throttle.schedule_many(conn, name, [
        {"item_key": "a"},
        {"item_key": "b", "run_at": datetime.timedelta(minutes=2), "payload": {"n": 2}, "group_key": "g"},
        {"item_key": "c", "run_at": NOW + datetime.timedelta(hours=2), "concurrency_key": "ck"},
        {"item_key": "a", "run_at": datetime.timedelta(minutes=7), "payload": {"n": 4}},
    ], priority=7)
    assert len(ids) == 4 and ids[0] == ids[3] and len(set(ids)) == 3
    a, b, c = (row(conn, i) for i in ids[:3])
    # 'a' twice: one event, the last mention's run_at and payload (replace).
    assert (a["run_at"], a["payload"], a["priority"]) == (NOW + datetime.timedelta(minutes=7), {"n": 4}, 7)
    assert (b["run_at"], b["payload"], b["group_key"]) == (NOW + datetime.timedelta(minutes=2), {"n": 2}, "g")
    assert (c["run_at"], c["payload"], c["concurrency_key"], c["group_key"]) == (
        NOW + datetime.timedelta(hours=2), {}, "ck", None)
    again = pg_throttle.schedule_many(conn, name, [{"item_key": "b", "run_at": datetime.timedelta(minutes=1)}],
                                      on_duplicate="ignore")
    assert again == [ids[1]] and row(conn, ids[1])["run_at"] == NOW + datetime.timedelta(minutes=2)
    with pytest.raises(TypeError):
        pg_throttle.schedule_many(conn, name, [{"item_key": "x", "priority": 1}])


def test_cancel_and_reschedule(clock, name):
    conn = clock
    event_id = pg_throttle.schedule(conn, name, "r", datetime.timedelta(days=1))
    assert pg_throttle.reschedule(conn, name, "r", NOW + datetime.timedelta(days=2)) is True
    assert row(conn, event_id)["run_at"] == NOW + datetime.timedelta(days=2)
    assert pg_throttle.reschedule(conn, name, "r", datetime.timedelta(seconds=30)) is True
    assert row(conn, event_id)["run_at"] == NOW + datetime.timedelta(seconds=30)
    assert pg_throttle.reschedule(conn, name, "nothing", None) is False
    assert pg_throttle.cancel(conn, name, "r") is True
    assert row(conn, event_id)["state"] == "cancelled"
    assert pg_throttle.cancel(conn, name, "r") is False
    # A claimed event is neither cancelled nor moved.
    pg_throttle.schedule(conn, name, "claimed")
    assert conn.execute("SELECT count(*) FROM throttle.claim(%s, 'w')", (name,)).fetchone()[0] == 1
    assert pg_throttle.cancel(conn, name, "claimed") is False
    assert pg_throttle.reschedule(conn, name, "claimed", None) is False
