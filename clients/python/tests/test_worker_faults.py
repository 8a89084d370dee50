"""The worker when things go wrong: errors whose text or delay the database
refuses, a slot's connection lost, a handler that ignores cancellation, a
handler that raises SystemExit, a failed batch in a group kept in strict
order. Each event's fate is read from throttle.all_events and
throttle.attempt_history, and the handlers' own logs say how often each ran."""
import datetime
import logging
import threading
import time

import psycopg
import pytest

import pg_throttle
from conftest import wait_until

MAX_RETRY_IN = datetime.timedelta(days=36525)       # pg_throttle.worker.MAX_RETRY_IN


def state(conn, event_id):
    return conn.execute("SELECT state, attempts, last_error FROM throttle.all_events WHERE id = %s",
                        (event_id,)).fetchone()


def outcomes(conn, event_id):
    return [r[0] for r in conn.execute("SELECT outcome FROM throttle.attempt_history WHERE event_id = %s "
                                       "ORDER BY claimed_at", (event_id,))]


def left(conn, queue):
    return conn.execute("SELECT count(*) FROM throttle.event WHERE queue = %s", (queue,)).fetchone()[0]


class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("no text for you")


def test_errors_the_database_refuses_fail_the_event_not_the_worker(conn, name, workers):
    """An error's text with NUL, with a lone surrogate, from a __str__ that
    raises, or very long, and RetryLater delays that are negative, out of the
    timestamp range or infinite: each fails its event (throttle.fail would
    have refused them, ending the worker and leaving the event claimed for the
    next worker to die on). The worker keeps working: the last event is done."""
    raises = {
        "nul": lambda: ValueError("binary garbage \x00 from a library"),
        "surrogate": lambda: ValueError("half a pair: \udc80"),
        "bad-str": lambda: BadStr(),
        "long": lambda: ValueError("x" * 100_000),
        "negative": lambda: pg_throttle.RetryLater(-1, "computed backoff went negative"),
        "huge": lambda: pg_throttle.RetryLater(datetime.timedelta(days=200_000_000), "never"),
        "infinite": lambda: pg_throttle.RetryLater(float("inf"), "never"),
    }
    ids = dict(zip(raises, pg_throttle.schedule_many(conn, name, [{"item_key": k} for k in raises])))
    last = pg_throttle.schedule(conn, name, "good")
    ran = []

    def handler(event, context):
        ran.append((event["item_key"], event["attempts"]))
        if event["item_key"] in raises and event["attempts"] == 1:
            raise raises[event["item_key"]]()
    worker = workers(name, handler, retry_in=3600, lease=5)
    assert wait_until(lambda: state(conn, last)[0] == "done" or worker.error is not None, 10)
    assert wait_until(lambda: state(conn, ids["negative"])[0] == "done" or worker.error is not None, 5)
    assert worker.error is None, repr(worker.error)
    rows = {key: state(conn, event_id) for key, event_id in ids.items()}
    assert rows["nul"] == ("pending", 1, "ValueError: binary garbage  from a library")
    assert rows["surrogate"] == ("pending", 1, "ValueError: half a pair: ?")
    assert rows["bad-str"] == ("pending", 1, "BadStr: <str() raised RuntimeError>")
    assert rows["long"][:2] == ("pending", 1) and rows["long"][2].startswith("ValueError: xxx")
    assert len(rows["long"][2]) <= 4000 and rows["long"][2].endswith("[truncated]")
    # A negative delay is "now": retried at once, done on the second attempt.
    assert rows["negative"] == ("done", 2, "RetryLater: computed backoff went negative")
    assert ran.count(("negative", 2)) == 1
    # A delay past what the database can store is clamped to a hundred years.
    for key in ("huge", "infinite"):
        assert rows[key] == ("pending", 1, "RetryLater: never")
        delay = conn.execute("SELECT run_at - failed_at FROM throttle.event WHERE id = %s", (ids[key],)).fetchone()[0]
        assert delay == MAX_RETRY_IN
    assert [r[0] for r in ran].count("good") == 1


def test_retry_later_checks_its_delay():
    assert pg_throttle.RetryLater(-5).retry_in == datetime.timedelta(0)
    assert pg_throttle.RetryLater(datetime.timedelta(days=10 ** 6)).retry_in == MAX_RETRY_IN
    assert pg_throttle.RetryLater(1.5).retry_in == datetime.timedelta(seconds=1.5)
    with pytest.raises(ValueError):
        pg_throttle.RetryLater(float("nan"))
    with pytest.raises(TypeError):
        pg_throttle.RetryLater("5")


def test_a_fail_still_refused_is_retried_with_a_safe_message(conn, name, workers):
    """The last resort: when throttle.fail refuses what the worker gives it
    even so (here a subclass hands it a NUL and a negative delay), the worker
    fails the event again with a plain message and the queue's backoff."""
    class Raw(pg_throttle.Worker):
        def _fail_args(self, slot, error):        # what no cleaning would let through
            return f"{type(error).__name__}: raw \x00 text", datetime.timedelta(seconds=-1)
    event_id = pg_throttle.schedule(conn, name, "bad")
    done = pg_throttle.schedule(conn, name, "after")

    def handler(event, context):
        if event["item_key"] == "bad":
            raise ValueError("bad")
    worker = Raw(name, handler, poll=0.2, lease=5).start()
    try:
        assert wait_until(lambda: state(conn, done)[0] == "done" or worker.error is not None, 10)
    finally:
        worker.stop(abort=True)
    assert worker.error is None, repr(worker.error)
    row = state(conn, event_id)
    assert row[:2] == ("pending", 1) and row[2].startswith("ValueError (its error could not be recorded: ")
    backoff = conn.execute("SELECT run_at - failed_at FROM throttle.event WHERE id = %s", (event_id,)).fetchone()[0]
    assert backoff == datetime.timedelta(seconds=10)      # the queue's backoff, not the -1 s


def slot_connections():
    """A connection factory that keeps what it made: made[0] is the worker's
    main loop connection, made[1] its first slot's."""
    made = []

    def factory():
        c = psycopg.connect("")
        made.append(c)
        return c
    return factory, made


def test_a_slot_connection_lost_during_a_job(conn, name, workers):
    """The slot's session is terminated while its handler runs: the heartbeat's
    extend fails, the claim is lost (the handler is cancelled, nothing ended).
    The slot is not given work on its dead connection: it reconnects, and the
    next event runs once and is completed; the lost one is taken over once its
    lease ends and completed too (the worker keeps running)."""
    factory, made = slot_connections()
    first = pg_throttle.schedule(conn, name, "first")
    ran, cancelled = [], threading.Event()

    def handler(event, context):
        ran.append((event["item_key"], event["attempts"]))
        if event["item_key"] == "first" and event["attempts"] == 1:
            if context.cancelled.wait(10):
                cancelled.set()
                raise pg_throttle.Cancelled()
    worker = workers(name, handler, conninfo=factory, lease=1.5)
    assert wait_until(lambda: ran, 5)
    conn.execute("SELECT pg_terminate_backend(%s)", (made[1].info.backend_pid,))
    assert cancelled.wait(5)                        # the heartbeat (every 0.5 s) noticed
    second = pg_throttle.schedule(conn, name, "second")
    assert wait_until(lambda: left(conn, name) == 0 or worker.error is not None, 10)
    assert worker.error is None, repr(worker.error)
    assert state(conn, second) == ("done", 1, None) and ran.count(("second", 1)) == 1
    assert outcomes(conn, first) == ["expired", "completed"]
    assert len(made) == 3                           # one reconnection


def test_a_slot_connection_lost_while_idle(conn, name, workers):
    """The slot's session is terminated between two jobs: the next claim is
    not made for the dead connection (its handler would run and only its
    complete would fail); the slot reconnects first, and the event runs once."""
    factory, made = slot_connections()
    first = pg_throttle.schedule(conn, name, "first")
    ran = []
    worker = workers(name, lambda event, context: ran.append(event["item_key"]), conninfo=factory, lease=5)
    assert wait_until(lambda: state(conn, first)[0] == "done", 5)
    slot_pid = made[1].info.backend_pid
    conn.execute("SELECT pg_terminate_backend(%s)", (slot_pid,))
    assert wait_until(lambda: slot_pid not in [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity")], 5)
    second = pg_throttle.schedule(conn, name, "second")
    assert wait_until(lambda: state(conn, second)[0] == "done" or worker.error is not None, 5)
    assert worker.error is None, repr(worker.error)
    assert ran == ["first", "second"] and outcomes(conn, second) == ["completed"]


def test_abort_frees_a_handler_that_ignores_cancelled(conn, name):
    """stop(abort=True) with a handler blocked in a call that never looks at
    context.cancelled: after abort_grace the worker stops extending, hands the
    event back (due now, its attempt counted) and run() returns. When the
    handler returns later, its event is not completed."""
    event_id = pg_throttle.schedule(conn, name, "stuck")
    release, running, returned = threading.Event(), threading.Event(), threading.Event()

    def handler(event, context):
        running.set()
        release.wait(30)            # a blocking call that does not look at context.cancelled
        returned.set()
    worker = pg_throttle.Worker(name, handler, lease=1.5, poll=0.2, abort_grace=0.5).start()
    try:
        assert running.wait(5)
        t0 = time.monotonic()
        worker.stop(abort=True, wait=False)
        assert worker.join(5), "run() did not return"
        took = time.monotonic() - t0
        assert 0.5 <= took < 3, took
        assert worker.error is None, repr(worker.error)
        row = conn.execute("SELECT state, attempts, last_error, run_at <= now() FROM throttle.event "
                           "WHERE id = %s", (event_id,)).fetchone()
        assert row == ("pending", 1, pg_throttle.Worker.HANDED_BACK, True)
        time.sleep(1.0)             # past the lease: nothing extended it
        release.set()
        assert returned.wait(5)
        time.sleep(0.3)
        assert state(conn, event_id)[:2] == ("pending", 1)
        assert outcomes(conn, event_id) == ["failed"]
    finally:
        release.set()


def test_stop_with_abort_waits_for_the_grace_only(conn, name):
    """stop(abort=True) (waiting) returns once the grace period is over, even
    with a handler that never returns."""
    pg_throttle.schedule(conn, name, "stuck")
    release, running = threading.Event(), threading.Event()

    def handler(event, context):
        running.set()
        release.wait(30)
    worker = pg_throttle.Worker(name, handler, poll=0.2, abort_grace=0.2).start()
    try:
        assert running.wait(5)
        done = threading.Event()
        threading.Thread(target=lambda: (worker.stop(abort=True), done.set()), daemon=True).start()
        assert done.wait(5), "stop(abort=True) did not return"
    finally:
        release.set()


def test_a_handler_raising_system_exit_hands_its_event_back(conn, name, workers):
    """SystemExit from a handler (sys.exit() deep in a library) ends the
    worker with it, but its event is handed back first, not left claimed until
    its lease ends."""
    event_id = pg_throttle.schedule(conn, name, "exit")

    def handler(event, context):
        raise SystemExit(3)
    worker = workers(name, handler, lease=60)
    assert worker.join(5)
    assert isinstance(worker.error, SystemExit)
    worker.error = None
    row = conn.execute("SELECT state, attempts, last_error, run_at <= now() FROM throttle.event WHERE id = %s",
                       (event_id,)).fetchone()
    assert row == ("pending", 1, pg_throttle.Worker.HANDED_BACK, True)


def test_strict_order_group_after_a_failure(conn, name, workers):
    """A group in strict order whose first event fails: the handler never
    sees the later ones in that claim; they go back to pending with their
    attempt not counted; the failed one runs again first, then the rest in
    order."""
    conn.execute("INSERT INTO throttle.group_policy (queue, strict_order) VALUES (%s, true)", (name,))
    try:
        ids = pg_throttle.schedule_many(conn, name, [{"item_key": f"s{n}", "group_key": "g"} for n in range(3)])
        seen = []

        def handler(event, context):
            seen.append((event["item_key"], event["attempts"]))
            if event["item_key"] == "s0" and event["attempts"] == 1:
                raise pg_throttle.RetryLater(0.3, "first try fails")
        workers(name, handler, groups=True, lease=5, concurrency=2)
        assert wait_until(lambda: left(conn, name) == 0, 10)
        assert seen == [("s0", 1), ("s0", 2), ("s1", 1), ("s2", 1)]
        assert [outcomes(conn, i) for i in ids] == [["failed", "completed"], ["released", "completed"],
                                                    ["released", "completed"]]
    finally:
        conn.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (name,))


def test_a_failed_batch_in_a_strict_group_counts_on_its_first_event(conn, name, workers, caplog):
    """batch=True, a group in strict order, max_attempts 1, a handler that
    always fails: a failed batch fails its first event alone (dead, its one
    attempt used); that fail sent the later ones back to pending, their
    attempt not counted, and the worker leaves them, as its log says. So each
    event dies of its own one attempt: three batches, not one."""
    conn.execute("INSERT INTO throttle.group_policy (queue, strict_order) VALUES (%s, true)", (name,))
    try:
        ids = pg_throttle.schedule_many(conn, name, [{"item_key": f"s{n}", "group_key": "g"} for n in range(3)],
                                        max_attempts=1)
        calls = []

        def handler(events, context):
            calls.append([e["item_key"] for e in events])
            raise RuntimeError("the batch is bad")
        with caplog.at_level(logging.INFO, logger="pg_throttle.worker"):
            worker = workers(name, handler, groups=True, batch=True, retry_in=60)
            assert wait_until(lambda: [state(conn, i)[0] for i in ids] == ["dead"] * 3, 5)
            worker.stop()
        assert calls == [["s0", "s1", "s2"], ["s1", "s2"], ["s2"]]
        assert [state(conn, i) for i in ids] == [("dead", 1, "RuntimeError: the batch is bad")] * 3
        assert [outcomes(conn, i) for i in ids] == [["failed"], ["released", "failed"],
                                                    ["released", "released", "failed"]]
        assert "extend renewed 0 of its 2 later events: they are no longer held" in caplog.text
        assert "extend renewed 0 of its 1 later events: they are no longer held" in caplog.text
        assert "was lost" not in caplog.text
    finally:
        conn.execute("DELETE FROM throttle.group_policy WHERE queue = %s", (name,))


def test_a_failed_batch_out_of_groups_fails_every_event(conn, name, workers):
    """Without groups a batch's events are failed together, each an attempt."""
    ids = pg_throttle.schedule_many(conn, name, [{"item_key": f"b{n}"} for n in range(3)])

    def handler(events, context):
        raise RuntimeError("batch failed")
    worker = workers(name, handler, batch=True, max=3, retry_in=60)
    assert wait_until(lambda: all(state(conn, i)[1] == 1 and state(conn, i)[0] == "pending" for i in ids), 5)
    worker.stop()
    assert [state(conn, i) for i in ids] == [("pending", 1, "RuntimeError: batch failed")] * 3


def test_a_hand_back_on_the_last_attempt_makes_the_event_dead(conn, name, workers):
    """As documented: the hand-back is throttle.fail(retry_in 0), which counts
    the attempt, so an event on its last attempt is dead after it."""
    event_id = pg_throttle.schedule(conn, name, "once", max_attempts=1)
    running = threading.Event()

    def handler(event, context):
        running.set()
        context.sleep(30)
    worker = workers(name, handler, lease=5)
    assert running.wait(5)
    worker.stop(abort=True)
    assert state(conn, event_id) == ("dead", 1, pg_throttle.Worker.HANDED_BACK)


@pytest.mark.parametrize("option", [
    {"retry_in": -1}, {"retry_in": float("inf")}, {"retry_in": float("nan")},
    {"retry_in": datetime.timedelta(days=10 ** 6)}, {"retry_in": "5"},
    {"poll": -1}, {"poll": 0}, {"poll": float("inf")}, {"concurrency": 1.5}, {"concurrency": True},
    {"concurrency": "2"}, {"max": 2.5}, {"max": 0}, {"lease": 0}, {"lease": float("nan")},
    {"abort_grace": -1}, {"handler": None}])
def test_bad_options_are_refused_at_construction(option):
    """Refused by Worker() rather than failing later inside run() (poll -1: a
    ValueError from select once the queue is empty; poll 0: a claim loop with
    no pause; retry_in -1: throttle.fail's 22023 at the first failure)."""
    handler = option.pop("handler", print)
    with pytest.raises((ValueError, TypeError)):
        pg_throttle.Worker("q", handler, **option)


def test_good_options_are_accepted():
    worker = pg_throttle.Worker("q", print, retry_in=0, poll=0.05, concurrency=3, max=10, abort_grace=0)
    assert worker.retry_in == datetime.timedelta(0) and worker.poll == 0.05
    assert pg_throttle.Worker("q", print).abort_grace == 2          # short: the abort means now


def test_a_factory_connection_in_a_transaction_is_closed(name):
    """A connection factory that returns a connection inside a transaction:
    autocommit cannot be set, the worker does not start, and the factory's
    connection is closed rather than leaked."""
    made = []

    def factory():
        c = psycopg.connect("")
        c.execute("SELECT 1")                   # opens a transaction
        made.append(c)
        return c
    with pytest.raises(psycopg.ProgrammingError):
        pg_throttle.Worker(name, print, conninfo=factory).start()
    assert len(made) == 1 and made[0].closed
