"""The worker runtime in this process (Worker.start / stop), against the server:
invariants come from the handlers' own logs and throttle.event_history."""
import collections
import datetime
import threading
import time

import psycopg
import pytest

import pg_throttle
from conftest import wait_until


class Log:
    """What the handlers did: (event id, group, claim token, thread, start, end, outcome)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lines = []

    def add(self, **line):
        with self.lock:
            self.lines.append(line)

    def outcomes(self):
        by_id = collections.defaultdict(list)
        for line in self.lines:
            by_id[line["id"]].append(line["outcome"])
        return dict(by_id)


def events(conn, queue):
    cur = conn.execute("""SELECT id, state, attempts, completed_by, last_error FROM throttle.all_events
                          WHERE queue = %s ORDER BY id""", (queue,))
    return cur.fetchall()


def left(conn, queue):
    return conn.execute("SELECT count(*) FROM throttle.event WHERE queue = %s", (queue,)).fetchone()[0]


def test_concurrency_drains_each_event_once(conn, name, workers):
    """concurrency=4: four handlers run at once (a barrier only four at once
    pass), and 40 events are each completed exactly once."""
    ids = pg_throttle.schedule_many(conn, name, [{"item_key": f"job:{n}"} for n in range(40)])
    log = Log()
    barrier = threading.Barrier(4, timeout=10)
    first = set(ids[:4])

    def handler(event, context):
        start = time.time()
        if event["id"] in first:
            barrier.wait()          # BrokenBarrierError unless four run at once
        time.sleep(0.005)
        log.add(id=event["id"], thread=threading.current_thread().name, start=start, end=time.time(),
                outcome="done")
    # max=1: one event per claim, so that the first four claims go to the four threads.
    worker = workers(name, handler, concurrency=4, max=1, name=f"{name}-w")
    assert wait_until(lambda: left(conn, name) == 0, 20)
    worker.stop()
    assert log.outcomes() == {i: ["done"] for i in ids}
    assert {line["thread"] for line in log.lines if line["id"] in first} == {
        f"pg_throttle-worker-{n}" for n in range(4)}
    assert [e[1:4] for e in events(conn, name)] == [("done", 1, f"{name}-w")] * 40
    assert worker.join(5)


def test_groups_never_on_two_workers_at_once(conn, name, workers):
    """Two workers of two threads each, claim_group: 12 groups of 4 events,
    each done once, and no two claims of one group ever overlap in the logs."""
    pg_throttle.schedule_many(conn, name, [{"item_key": f"e:{n}", "group_key": f"g:{n % 12}"} for n in range(48)])
    log = Log()

    def handler(event, context):
        start = time.time()
        time.sleep(0.01)
        log.add(id=event["id"], group=event["group_key"], token=context.token, start=start, end=time.time(),
                worker=context.name, outcome="done")
    for n in range(2):
        workers(name, handler, groups=True, concurrency=2, name=f"{name}-{n}")
    assert wait_until(lambda: left(conn, name) == 0, 20)
    assert sorted(log.outcomes().values()) == [["done"]] * 48
    spans = collections.defaultdict(dict)           # group -> token -> [start, end]
    for line in log.lines:
        span = spans[line["group"]].setdefault(line["token"], [line["start"], line["end"]])
        span[0], span[1] = min(span[0], line["start"]), max(span[1], line["end"])
    clashes = [(g, a, b) for g, claims in spans.items() for a in claims for b in claims
               if a < b and claims[a][0] < claims[b][1] and claims[b][0] < claims[a][1]]
    assert len(spans) == 12 and not clashes
    assert {line["worker"] for line in log.lines} == {f"{name}-0", f"{name}-1"}
    assert {e[1] for e in events(conn, name)} == {"done"}


def test_heartbeat_extends_past_the_lease(conn, name, workers):
    """A 3.5 s job under a 1.5 s lease: the heartbeat (every 0.5 s) keeps the
    claim, an eager second worker never gets the event, and it is completed once."""
    event_id = pg_throttle.schedule(conn, name, "long")
    calls = Log()

    def slow(event, context):
        start = time.time()
        time.sleep(3.5)
        calls.add(id=event["id"], worker=context.name, lost=context.lost.is_set(), start=start, end=time.time(),
                  outcome="done")

    def eager(event, context):
        calls.add(id=event["id"], worker=context.name, outcome="done")
    workers(name, slow, lease=1.5, name=f"{name}-slow")
    assert wait_until(lambda: events(conn, name)[0][1] == "claimed", 5)
    workers(name, eager, lease=1.5, poll=0.05, name=f"{name}-eager")
    assert wait_until(lambda: left(conn, name) == 0, 10)
    assert [(c["worker"], c["lost"]) for c in calls.lines] == [(f"{name}-slow", False)]
    assert events(conn, name) == [(event_id, "done", 1, f"{name}-slow", None)]
    attempts = conn.execute("SELECT count(*) FROM throttle.event_attempt WHERE event_id = %s", (event_id,))
    assert attempts.fetchone()[0] == 0


def test_lost_claim(conn, name, workers):
    """release_group under a job: the handler sees lost (and cancelled) within
    a beat, and the event is neither completed nor failed by that claim."""
    event_id = pg_throttle.schedule(conn, name, "job", group_key="g")
    seen = Log()

    def handler(event, context):
        start = time.time()
        cancelled = context.cancelled.wait(8)
        seen.add(id=event["id"], lost=context.lost.is_set(), cancelled=cancelled, start=start, end=time.time(),
                 outcome="cancelled" if cancelled else "done")
        if cancelled:
            raise pg_throttle.Cancelled()
    workers(name, handler, groups=True, lease=1.5, name=f"{name}-w")
    assert wait_until(lambda: events(conn, name)[0][1] == "claimed", 5)
    released_at = time.time()
    assert conn.execute("SELECT throttle.release_group(%s, 'g')", (name,)).fetchone()[0] == 1
    assert wait_until(lambda: seen.lines, 10)
    line = seen.lines[0]
    # The beat comes every 0.5 s; 3 s is slack for a busy machine, well under the job's 8 s.
    assert line["lost"] and line["cancelled"] and line["end"] - released_at < 3
    # Released, not completed nor failed: pending again, with its attempt recorded as released.
    cur = conn.execute("SELECT claimed_by, outcome FROM throttle.attempt_history WHERE event_id = %s ORDER BY 1",
                       (event_id,))
    outcomes = cur.fetchall()
    assert outcomes[0] == (f"{name}-w", "released")
    assert "completed" not in [o[1] for o in outcomes] and "failed" not in [o[1] for o in outcomes]


def test_fail_with_retry_in_sets_run_at(conn, name, workers):
    """A handler's error fails the event with retry_in (the worker's, or
    RetryLater's own): pending again at now + retry_in, the error kept."""
    plain = pg_throttle.schedule(conn, name, "plain", payload={"delay": None})
    own = pg_throttle.schedule(conn, name, "own", payload={"delay": 120})

    def handler(event, context):
        if event["payload"]["delay"] is None:
            raise RuntimeError("boom")
        raise pg_throttle.RetryLater(event["payload"]["delay"], "not yet")
    worker = workers(name, handler, retry_in=3600, name=f"{name}-w")

    def failed():
        return conn.execute("SELECT count(*) FROM throttle.event WHERE queue = %s AND failed_at IS NOT NULL",
                            (name,)).fetchone()[0] == 2
    assert wait_until(failed, 10)
    worker.stop()
    cur = conn.execute("""SELECT id, state, attempts, last_error, extract(epoch FROM run_at - failed_at)
                          FROM throttle.event WHERE queue = %s ORDER BY id""", (name,))
    rows = cur.fetchall()
    assert [r[:4] for r in rows] == [
        (plain, "pending", 1, "RuntimeError: boom"), (own, "pending", 1, "RetryLater: not yet")]
    assert [float(r[4]) for r in rows] == [3600.0, 120.0]


def test_batch_handler(conn, name, workers):
    ids = pg_throttle.schedule_many(conn, name, [{"item_key": f"b:{n}"} for n in range(6)])
    batches = []
    workers(name, lambda evs, context: batches.append(sorted(e["id"] for e in evs)), batch=True, max=3)
    assert wait_until(lambda: left(conn, name) == 0, 10)
    assert sorted(i for b in batches for i in b) == ids and all(len(b) <= 3 for b in batches)


def test_graceful_stop_finishes_then_abort_hands_back(conn, name, workers):
    """stop(): the job running is finished and completed, nothing more is
    claimed. stop(abort=True): the job is cancelled at once and handed back,
    due again at once."""
    first = pg_throttle.schedule(conn, name, "first")
    log = Log()
    running = threading.Event()

    def handler(event, context):
        running.set()
        start = time.time()
        try:
            context.sleep(1 if event["item_key"] == "first" else 30)
            outcome = "done"
        except pg_throttle.Cancelled:
            outcome = "cancelled"
            raise
        finally:
            log.add(id=event["id"], start=start, end=time.time(), outcome=outcome, stopping=context.stopping)
    worker = workers(name, handler, name=f"{name}-w")
    assert running.wait(5)
    later = pg_throttle.schedule(conn, name, "later")
    stop_called = time.time()
    worker.stop()                       # waits for the worker to end
    assert worker.join(0) and worker.error is None
    assert log.lines == [{"id": first, "start": log.lines[0]["start"], "end": log.lines[0]["end"],
                          "outcome": "done", "stopping": True}]
    assert log.lines[0]["end"] > stop_called
    assert [e[:4] for e in events(conn, name)] == [(first, "done", 1, f"{name}-w"), (later, "pending", 0, None)]

    running.clear()
    worker = workers(name, handler, name=f"{name}-w2")
    assert running.wait(5)
    t0 = time.monotonic()
    worker.stop(abort=True)
    assert time.monotonic() - t0 < 5
    row = conn.execute("SELECT state, attempts, last_error, run_at <= now() FROM throttle.event WHERE id = %s",
                       (later,)).fetchone()
    assert row == ("pending", 1, pg_throttle.Worker.HANDED_BACK, True)
    assert log.lines[-1]["outcome"] == "cancelled"


def test_options_are_checked():
    with pytest.raises(ValueError):
        pg_throttle.Worker("q", print, concurrency=0)
    with pytest.raises(ValueError):
        pg_throttle.Worker("q", print, on_term="later")
    with pytest.raises(ValueError):
        pg_throttle.Worker("q", print, install_signal_handlers=True).start()
    assert pg_throttle.Worker("q", print, lease=datetime.timedelta(seconds=5)).lease == datetime.timedelta(seconds=5)


def test_stop_from_a_handler(conn, name, workers):
    """A handler may stop its own worker: the event is completed, the worker
    ends (stop() does not wait for the thread it is called from)."""
    ids = pg_throttle.schedule_many(conn, name, [{"item_key": "a"}, {"item_key": "b"}])

    def handler(event, context):
        context.worker.stop()
    worker = workers(name, handler, max=1, name=f"{name}-w")
    assert worker.join(10)
    assert [e[1] for e in events(conn, name)] == ["done", "pending"] and events(conn, name)[0][0] == ids[0]


def test_notify_wakes_an_idle_worker(conn, name, workers):
    """A worker that polls once a minute picks up an event due now within a
    second: the NOTIFY on the queue's channel wakes it (the name has dots, so
    the LISTEN must quote it)."""
    worker = workers(name, lambda event, context: None, poll=60, concurrency=2)
    latencies = []
    for n in range(3):
        time.sleep(0.2)                 # idle, asleep in its wait
        t0 = time.monotonic()
        event_id = pg_throttle.schedule(conn, name, f"now:{n}")
        assert wait_until(lambda: conn.execute("SELECT state FROM throttle.all_events WHERE id = %s",
                                               (event_id,)).fetchone()[0] == "done", 5, 0.005)
        latencies.append(time.monotonic() - t0)
    assert max(latencies) < 1.0, latencies
    worker.stop()


def test_connection_factory(conn, name, workers):
    """conninfo may be a callable: the worker opens concurrency + 1
    connections with it, in autocommit whatever the factory made."""
    made = []

    def factory():
        c = psycopg.connect("", application_name=name[:60])
        made.append(c)
        return c
    pg_throttle.schedule(conn, name, "one")
    worker = workers(name, lambda event, context: None, conninfo=factory, concurrency=2)
    assert wait_until(lambda: left(conn, name) == 0, 10)
    worker.stop()
    assert len(made) == 3 and all(c.closed for c in made)
