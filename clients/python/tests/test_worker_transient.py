"""The worker and SQL errors that pass: a statement refused by a
serialization failure, a deadlock, a lock timeout or a statement timeout
(40001, 40P01, 55P03, 57014) rolled back, and sent again it may well work.
Here a lock timeout (the worker's sessions have lock_timeout 150 ms) while
another session holds throttle.event, as a migration or VACUUM FULL would.

- A claim refused so does not end run(): it claims again after a pause.
- An extend refused so does not mark the claim lost while its lease holds:
  the heartbeat tries again; the claim is given up only once no extend
  renewed it within the lease less a margin.
- A complete refused so is sent again: the handler's success stands.
- An abort while a claim is in flight (a claim waiting on a lock) hands the
  claim's events back when it returns, rather than leaving them claimed for
  their lease; a statement of a slot stuck on a lock does not hold run()
  past abort_grace."""
import threading
import time

import psycopg

import pg_throttle
from conftest import wait_until

LOCK_TIMEOUT = "options='-c lock_timeout=150'"


def hold_event_table(seconds_):
    """Locks throttle.event ACCESS EXCLUSIVE on a connection of its own for
    `seconds_`, in a thread; returns (locked, thread)."""
    locked = threading.Event()

    def run():
        with psycopg.connect("") as c:
            c.execute("LOCK TABLE throttle.event IN ACCESS EXCLUSIVE MODE")
            locked.set()
            time.sleep(seconds_)
            c.rollback()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert locked.wait(5)
    return t


def test_a_lock_timeout_on_claim_does_not_end_the_worker(conn, name):
    worker = pg_throttle.Worker(name, lambda e, c: None, conninfo=LOCK_TIMEOUT, poll=0.1)
    worker.start()
    try:
        t = hold_event_table(0.6)       # the worker polls every 0.1 s: its claim waits and times out
        t.join()
        event_id = pg_throttle.schedule(conn, name, "after-the-lock")
        assert wait_until(lambda: conn.execute("SELECT state FROM throttle.all_events WHERE id = %s",
                                               (event_id,)).fetchone()[0] == "done", 5), \
            f"the worker ended: {worker.error!r}"
    finally:
        worker.stop(abort=True)
    assert worker.error is None, worker.error


def test_a_lock_timeout_on_extend_does_not_throw_the_work_away(conn, name):
    event_id = pg_throttle.schedule(conn, name, "slow")
    started = threading.Event()
    results = []

    def handler(event, context):
        started.set()
        time.sleep(2.0)
        results.append(context.lost.is_set())

    # lease 3 s: the heartbeat extends at 1 s, 2 s; the lock covers the first beat only.
    worker = pg_throttle.Worker(name, handler, conninfo=LOCK_TIMEOUT, lease=3, poll=0.1)
    worker.start()
    try:
        assert started.wait(5)
        time.sleep(0.7)
        hold_event_table(0.6).join()
        assert wait_until(lambda: results, 5)
        time.sleep(0.3)
        state = conn.execute("SELECT state FROM throttle.all_events WHERE id = %s", (event_id,)).fetchone()[0]
    finally:
        worker.stop(abort=True)
    # The lease never ran out (3 s, extended at 2 s at the latest) and no one else had the event.
    assert (results, state) == ([False], "done")


def test_an_abort_during_a_slow_claim_hands_the_claim_back(conn, name):
    event_id = pg_throttle.schedule(conn, name, "claimed-late")
    ran = []
    worker = pg_throttle.Worker(name, lambda e, c: ran.append(e["id"]), lease=60, poll=0.1,
                                abort_grace=0.2, listen=False)
    locker_ready = threading.Event()
    release = threading.Event()

    def locker():
        with psycopg.connect("") as c:
            c.execute("LOCK TABLE throttle.event IN ACCESS EXCLUSIVE MODE")
            locker_ready.set()
            release.wait(10)
            c.rollback()
    lt = threading.Thread(target=locker, daemon=True)
    lt.start()
    assert locker_ready.wait(5)
    worker.start()                      # its first claim waits for the lock
    time.sleep(0.3)
    worker.stop(abort=True, wait=False)
    time.sleep(0.5)                     # past abort_grace
    release.set()                       # the claim returns the event now
    assert worker.join(10)
    lt.join()
    time.sleep(0.3)
    state = conn.execute("SELECT state FROM throttle.all_events WHERE id = %s", (event_id,)).fetchone()[0]
    assert worker.error is None, worker.error
    # Handed back (pending, due now), not claimed for the 60 s lease.
    assert state == "pending", state


def test_a_lock_timeout_on_complete_does_not_throw_the_work_away(conn, name):
    """Were the complete not sent again, the handler's success would be
    dropped and the event run again after its 30 s lease."""
    event_id = pg_throttle.schedule(conn, name, "done-once")
    started = threading.Event()
    ran = []

    def handler(event, context):
        ran.append(event["id"])
        started.set()
        time.sleep(0.5)

    worker = pg_throttle.Worker(name, handler, conninfo=LOCK_TIMEOUT, lease=30, poll=0.1)
    worker.start()
    try:
        assert started.wait(5)
        hold_event_table(0.8).join()    # the complete at 0.5 s waits 150 ms for the lock
        time.sleep(1.0)
        state = conn.execute("SELECT state FROM throttle.all_events WHERE id = %s", (event_id,)).fetchone()[0]
    finally:
        worker.stop(abort=True)
    assert (ran, state) == ([event_id], "done")


def test_an_extend_refused_until_the_deadline_gives_the_claim_up(conn, name):
    """Transient errors on every extend: the claim is given up at its local
    deadline (lease 3 s less a margin of 0.5 s from the claim), not at the
    first error (1 s), and nothing completes its event."""
    event_id = pg_throttle.schedule(conn, name, "never-renewed")
    started = threading.Event()
    seen = []

    def handler(event, context):
        t0 = time.monotonic()
        started.set()
        context.cancelled.wait(10)
        seen.append((context.lost.is_set(), time.monotonic() - t0))
        context.check()

    worker = pg_throttle.Worker(name, handler, conninfo=LOCK_TIMEOUT, lease=3, poll=0.1)
    worker.start()
    try:
        assert started.wait(5)
        holder = hold_event_table(3.5)       # every extend until the deadline times out
        assert wait_until(lambda: seen, 10)
        holder.join()
    finally:
        worker.stop(abort=True)
    assert worker.error is None, worker.error
    # (Once its lease has ended, the worker may claim the event again: a
    # second run, not this claim's.)
    lost, after = seen[0]
    assert lost
    # Not before the deadline (2.5 s after the claim was sent, which was before
    # the handler started), nor long after it.
    assert 1.9 <= after <= 3.5, after
    history = conn.execute("SELECT outcome FROM throttle.attempt_history WHERE event_id = %s ORDER BY claimed_at",
                           (event_id,)).fetchall()
    assert "completed" not in [o for o, in history], history


def test_a_stuck_complete_does_not_hold_run_past_abort_grace(conn, name):
    """A complete waiting on a lock (no lock_timeout) when the worker is
    aborted: run() returns soon after abort_grace, having cancelled it, and
    the event is left to its lease (the claim given up), never completed."""
    event_id = pg_throttle.schedule(conn, name, "stuck-complete")
    locked, release, handled = threading.Event(), threading.Event(), threading.Event()

    def locker():
        with psycopg.connect("") as c:
            c.execute("LOCK TABLE throttle.event IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(20)
            c.rollback()

    def handler(event, context):
        threading.Thread(target=locker, daemon=True).start()
        assert locked.wait(5)
        handled.set()                         # returns: its complete waits for the lock

    worker = pg_throttle.Worker(name, handler, lease=30, poll=0.1, abort_grace=0.3, listen=False)
    worker.start()
    try:
        assert handled.wait(5)
        time.sleep(0.3)                       # the complete is waiting
        t0 = time.monotonic()
        worker.stop(abort=True, wait=False)
        returned = worker.join(6)
        took = time.monotonic() - t0
    finally:
        release.set()
    assert returned and took < 0.3 + 2.5, took
    assert worker.error is None, worker.error
    time.sleep(0.2)
    state = conn.execute("SELECT state FROM throttle.all_events WHERE id = %s", (event_id,)).fetchone()[0]
    assert state == "claimed", state          # given up: its lease ends it, not a complete
