#!/usr/bin/python3
"""The Python client examples (examples/python, psycopg 3) run for real.

queue_worker.py: three worker processes per queue drain 300 events (claim) and
40 groups of 5 (claim_group), some failing once; every event is completed
exactly once, in the workers' logs and in the tables, and no group is worked on
by two workers at once. LISTEN wakes an idle worker at once; the heartbeat keeps
a long job's claim; SIGTERM finishes or hands back the job and exits 0; a claim
lost to release_group is dropped, never completed; in a group in strict order,
the events behind a failed one wait for its retry, and a hand-back sends them
back to pending without calling the claim lost.

ratelimit_server.py: real HTTP requests get 200 while the bucket has units and
429 with Retry-After after, with the RateLimit-* headers on every answer; an
X-Api-Key too long for a bucket name gets 400. The shapes are slow (1 per 10 s)
so that the answers do not depend on how fast the requests come.
"""
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one  # noqa: E402
from polling import wait_until  # noqa: E402
from ratelimit_http import check_burst, check_wait_out, get, limits  # noqa: E402
from tap import Tap  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "examples", "python", "queue_worker.py")
SERVER = os.path.join(ROOT, "examples", "python", "ratelimit_server.py")
PYTHON = "/usr/bin/python3"
PREFIX = "ex.py."          # every queue of this test; dots check the LISTEN quoting
FAIL_ERROR = "RuntimeError: the payload asks to fail the first attempt"


class Processes:
    """The processes the test starts, each in a session of its own, so that
    cleanup can kill it and anything it started on every exit path."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = {}

    def start(self, name, argv):
        out = open(os.path.join(self.tmp, f"{name}.out"), "w")
        err = open(os.path.join(self.tmp, f"{name}.err"), "w")
        proc = subprocess.Popen([PYTHON] + argv, stdout=out, stderr=err, start_new_session=True)
        out.close()
        err.close()
        self.procs[name] = proc
        return proc

    def output(self, name, stream="out"):
        with open(os.path.join(self.tmp, f"{name}.{stream}")) as f:
            return f.read()

    def worker(self, name, queue, *options):
        self.start(name, [WORKER, queue, "--name", name, "--log", self.log(name), *options])
        if not wait_until(lambda: "listening" in self.output(name) or self.procs[name].poll() is not None, 15):
            raise RuntimeError(f"{name} did not start: {self.output(name, 'err')}")
        if self.procs[name].poll() is not None:
            raise RuntimeError(f"{name} exited: {self.output(name, 'err')}")

    def log(self, name):
        return os.path.join(self.tmp, f"{name}.log")

    def terminate(self, name, timeout=15):
        """SIGTERM; the exit status, or None when it did not exit in time."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()


def log_lines(procs, *names):
    lines = []
    for name in names:
        path = procs.log(name)
        if os.path.exists(path):
            with open(path) as f:
                lines += [json.loads(line) for line in f]
    return sorted(lines, key=lambda line: line["start"])


def overlapping(spans):
    """Pairs of spans (start, end, owner) of different owners that overlap."""
    return [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:]
            if a[2] != b[2] and a[0] < b[1] and b[0] < a[1]]


def drain(tap, procs, cur):
    jobs, orders = PREFIX + "jobs", PREFIX + "orders"
    # 300 events without a group, every tenth failing once; 40 groups of 5,
    # every seventh event failing once.
    cur.execute("""SELECT count(throttle.schedule(%s, 'job:' || n, now(),
                          jsonb_build_object('fail', n %% 10 = 0)))
                   FROM generate_series(1, 300) AS n""", (jobs,))
    scheduled = cur.fetchone()[0]
    cur.execute("""SELECT count(throttle.schedule(%s, 'order:' || n, now(),
                          jsonb_build_object('fail', n %% 7 = 0), group_key => 'customer:' || n %% 40))
                   FROM generate_series(1, 200) AS n""", (orders,))
    scheduled += cur.fetchone()[0]
    tap.is_(scheduled, 500, "500 events scheduled in the two queues")

    names = {jobs: ["jobs-1", "jobs-2", "jobs-3"], orders: ["orders-1", "orders-2", "orders-3"]}
    t0 = time.monotonic()
    for name in names[jobs]:
        procs.worker(name, jobs, "--poll", "0.5", "--retry-in", "0.3", "--work-ms", "2")
    for name in names[orders]:
        procs.worker(name, orders, "--groups", "--poll", "0.5", "--retry-in", "0.3", "--work-ms", "5")

    def left():
        return one(cur.connection, "SELECT count(*) FROM throttle.event WHERE queue IN (%s, %s)",
                   (jobs, orders))[0]
    drained = wait_until(lambda: left() == 0, 40, 0.1)
    tap.ok(drained, f"the workers drained both queues ({time.monotonic() - t0:.1f} s)",
           f"{left()} events left: " + str(one(cur.connection, """
               SELECT json_agg(json_build_object('id', id, 'state', state, 'error', last_error))
               FROM throttle.event WHERE queue IN (%s, %s)""", (jobs, orders))[0]))

    statuses = {name: procs.terminate(name) for name in names[jobs] + names[orders]}
    tap.ok(all(s == 0 for s in statuses.values()), "idle workers exit 0 on SIGTERM", str(statuses))

    # The tables: every event done, failed once exactly when its payload asked.
    cur.execute("""SELECT id, queue, group_key, state, attempts, completed_by, (payload->>'fail')::boolean
                   FROM throttle.all_events WHERE queue IN (%s, %s)""", (jobs, orders))
    events = {row[0]: row for row in cur.fetchall()}
    cur.execute("""SELECT event_id, outcome, error, claimed_by FROM throttle.event_attempt
                   WHERE event_id = ANY(%s) ORDER BY id""", (list(events),))
    ended = collections.defaultdict(list)
    for event_id, outcome, error, _ in cur.fetchall():
        ended[event_id].append((outcome, error))
    wrong = [(e[0], e[3], e[4], ended[e[0]]) for e in events.values()
             if e[3] != "done" or e[4] != (2 if e[6] else 1)
             or ended[e[0]] != ([("failed", FAIL_ERROR)] if e[6] else [])]
    tap.ok(len(events) == 500 and not wrong,
           "throttle.event_history: every event done, those asked to fail with one failed attempt first",
           f"{len(events)} events; wrong (id, state, attempts, ended attempts): {wrong[:10]}")

    # The workers' logs: one 'done' per event, after one 'failed' for those asked to fail.
    lines = log_lines(procs, *names[jobs], *names[orders])
    outcomes = collections.defaultdict(list)
    for line in lines:
        outcomes[line["id"]].append(line["outcome"])
    wrong = [(i, outcomes.get(i)) for i, e in events.items()
             if outcomes.get(i) != (["failed", "done"] if e[6] else ["done"])]
    tap.ok(len(outcomes) == 500 and not wrong,
           "the workers' logs: every event worked on to completion exactly once",
           f"{len(outcomes)} events logged; wrong: {wrong[:10]}")
    done_by = {line["id"]: line["worker"] for line in lines if line["outcome"] == "done"}
    wrong = [(i, done_by.get(i), e[5]) for i, e in events.items() if done_by.get(i) != e[5]]
    tap.ok(not wrong, "the worker that logged each event done is its completed_by", str(wrong[:10]))

    # Groups: no two workers at once, by the logs and by the claims in the tables.
    group_lines = [line for line in lines if line["group_key"] is not None]
    by_group = collections.defaultdict(list)
    for line in group_lines:
        by_group[line["group_key"]].append((line["start"], line["end"], line["worker"]))
    clashes = [c for spans in by_group.values() for c in overlapping(spans)]
    workers_on_groups = {line["worker"] for line in group_lines}
    tap.ok(len(by_group) == 40 and not clashes and len(workers_on_groups) > 1,
           f"the logs: {len(workers_on_groups)} workers shared 40 groups, never two on one group at once",
           f"{len(by_group)} groups; overlapping spans: {clashes[:5]}")
    # One claim = (claimed_by, claimed_at); it lasts until its last event ended.
    cur.execute("""SELECT e.group_key, a.claimed_by || '@' || a.claimed_at,
                          extract(epoch FROM min(a.claimed_at)), extract(epoch FROM max(a.ended_at))
                   FROM throttle.attempt_history a JOIN throttle.all_events e ON e.id = a.event_id
                   WHERE e.queue = %s GROUP BY 1, 2""", (orders,))
    claims = collections.defaultdict(list)
    for group, claim, start, end in cur.fetchall():
        claims[group].append((float(start), float(end), claim))
    clashes = [c for spans in claims.values() for c in overlapping(spans)]
    tap.ok(len(claims) == 40 and not clashes,
           f"the tables: the {sum(map(len, claims.values()))} claims of each group never overlap",
           f"overlapping claims: {clashes[:5]}")


def listen(tap, procs, cur):
    queue = PREFIX + "listen"
    # A poll every minute: only the NOTIFY can wake this worker in time.
    procs.worker("listener", queue, "--poll", "60")
    latencies = []
    for n in range(3):
        time.sleep(0.3)         # idle, asleep in its wait
        t0 = time.monotonic()
        event_id = one(cur.connection, "SELECT throttle.schedule(%s, %s, now())", (queue, f"now:{n}"))[0]
        wait_until(lambda: one(cur.connection, "SELECT state FROM throttle.all_events WHERE id = %s",
                               (event_id,))[0] == "done", 5, 0.005)
        latencies.append(round(time.monotonic() - t0, 3))
    tap.ok(max(latencies) < 1.0,
           f"LISTEN: an event due now is done within 1 s by a worker that polls every 60 s "
           f"(slowest {max(latencies):.3f} s)",
           f"seconds from schedule to done: {latencies}")
    tap.is_(procs.terminate("listener"), 0, "the listener exits 0 on SIGTERM")


def claimed_by(cur, queue, worker):
    return one(cur.connection, "SELECT count(*) FROM throttle.event WHERE queue = %s AND state = 'claimed' "
               "AND claimed_by = %s", (queue, worker))[0] == 1


FINISH_LEASE_S, FINISH_WORK_S = 3, 6     # sigterm_finish: the job outlasts two leases


def sigterm_finish(tap, procs, cur):
    """SIGTERM in the middle of a 6 s job with a 3 s lease: the heartbeat keeps
    the claim (a second, eager worker never gets the event), the job finishes
    and is completed, and the stopping worker claims nothing more. The beat
    comes every second, 2 s before the lease ends: time for a durable extend
    on a busy machine."""
    queue = PREFIX + "long"
    procs.worker("long-1", queue, "--lease", str(FINISH_LEASE_S), "--work-ms", str(FINISH_WORK_S * 1000),
                 "--poll", "0.2")
    event_id = one(cur.connection, "SELECT throttle.schedule(%s, 'long', now())", (queue,))[0]
    wait_until(lambda: claimed_by(cur, queue, "long-1"), 10)
    procs.worker("long-2", queue, "--lease", str(FINISH_LEASE_S), "--poll", "0.1")
    time.sleep(FINISH_LEASE_S + 0.3)    # past the first lease: only extend keeps it
    signalled = time.time()
    status = procs.terminate("long-1")
    after_id = one(cur.connection, "SELECT throttle.schedule(%s, 'after', now())", (queue,))[0]
    wait_until(lambda: one(cur.connection, "SELECT state FROM throttle.all_events WHERE id = %s",
                           (after_id,))[0] == "done", 10)
    tap.is_(status, 0, "SIGTERM during a job: the worker finishes it and exits 0")
    row = one(cur.connection, """SELECT state, attempts, completed_by,
                                        (SELECT count(*) FROM throttle.event_attempt WHERE event_id = %s)
                                 FROM throttle.all_events WHERE id = %s""", (event_id, event_id))
    lines = [(line["worker"], line["outcome"], line["end"] > signalled,
              line["end"] - line["start"] >= FINISH_WORK_S - 0.1)
             for line in log_lines(procs, "long-1", "long-2") if line["id"] == event_id]
    tap.ok(row == ("done", 1, "long-1", 0) and lines == [("long-1", "done", True, True)],
           "the heartbeat kept the claim past its lease and the job was completed once, after the SIGTERM",
           f"(state, attempts, completed_by, ended attempts) {row}; log (worker, outcome, ended after "
           f"SIGTERM, took {FINISH_WORK_S} s) {lines}")
    tap.is_(one(cur.connection, "SELECT completed_by FROM throttle.all_events WHERE id = %s", (after_id,))[0],
            "long-2", "a stopping worker claims nothing more: the next event went to the other worker")
    procs.terminate("long-2")


def sigterm_handback(tap, procs, cur):
    """With --on-term handback, SIGTERM stops a 30 s job at once and fails the
    event back with retry_in 0: the other worker, started only then, completes it."""
    queue = PREFIX + "handback"
    procs.worker("back-1", queue, "--on-term", "handback", "--lease", "2", "--work-ms", "30000", "--poll", "0.2")
    event_id = one(cur.connection, "SELECT throttle.schedule(%s, 'long', now())", (queue,))[0]
    wait_until(lambda: claimed_by(cur, queue, "back-1"), 10)
    t0 = time.monotonic()
    status = procs.terminate("back-1")
    took = time.monotonic() - t0
    # The hand-back shows in the row, not in the time taken (that includes the
    # interpreter's shutdown): pending, due now, the attempt counted. 10 s is
    # only the bound that the 30 s job was not finished.
    state = one(cur.connection, """SELECT state, attempts, last_error, run_at <= now() FROM throttle.event
                                   WHERE id = %s""", (event_id,))
    tap.ok(status == 0 and took < 10 and state == ("pending", 1, "worker stopping: handed back", True),
           f"SIGTERM with --on-term handback: the worker stops its 30 s job, hands the event back due at "
           f"once, and exits 0 ({took:.1f} s)",
           f"status {status}; (state, attempts, last_error, due) {state}")
    procs.worker("back-2", queue, "--poll", "0.2")
    wait_until(lambda: one(cur.connection, "SELECT state FROM throttle.all_events WHERE id = %s",
                           (event_id,))[0] == "done", 10)
    cur.execute("""SELECT claimed_by, outcome, error FROM throttle.attempt_history
                   WHERE event_id = %s ORDER BY claimed_at""", (event_id,))
    attempts = cur.fetchall()
    lines = [(line["worker"], line["outcome"]) for line in log_lines(procs, "back-1", "back-2")
             if line["id"] == event_id]
    # back-1 logs "cancelled" when the SIGTERM stopped its handle(); a SIGTERM
    # between its claim and handle() hands the event back without a line.
    tap.ok(attempts == [("back-1", "failed", "worker stopping: handed back"), ("back-2", "completed", None)]
           and lines in ([("back-1", "cancelled"), ("back-2", "done")], [("back-2", "done")]),
           "the handed-back event was completed once, by the other worker",
           f"attempts {attempts}; log {lines}")
    procs.terminate("back-2")


def strict_order(tap, procs, cur):
    """A group in strict order whose first event fails once: the fail hands
    the claim's later events back, to run after its retry. The workers must
    leave them, not handle them out of order."""
    queue = PREFIX + "strict"
    cur.execute("""INSERT INTO throttle.group_policy (queue, workers, strict_order) VALUES (%s, 1, true)
                   ON CONFLICT (queue) DO UPDATE SET workers = 1, strict_order = true""", (queue,))
    # From one session, one after the other: the ids give the order.
    ids = [one(cur.connection, "SELECT throttle.schedule(%s, %s, now(), %s::jsonb, group_key => 'g')",
               (queue, f"step:{n}", payload))[0]
           for n, payload in enumerate(['{"fail": true}', '{}', '{}'], 1)]
    names = ["strict-1", "strict-2"]
    for name in names:
        procs.worker(name, queue, "--groups", "--poll", "0.2", "--retry-in", "0.3", "--work-ms", "20")

    def finished():
        return one(cur.connection, "SELECT count(*) FROM throttle.event_history WHERE id = ANY(%s)",
                   (ids,))[0] == 3
    wait_until(finished, 20, 0.05)
    statuses = [procs.terminate(name) for name in names]
    lines = log_lines(procs, *names)
    handled = [(ids.index(line["id"]) + 1, line["outcome"]) for line in lines if line["id"] in ids]
    first_done = next((line["end"] for line in lines if line["id"] == ids[0] and line["outcome"] == "done"), None)
    too_early = [(ids.index(line["id"]) + 1, line["outcome"]) for line in lines if line["id"] in ids[1:]
                 and (first_done is None or line["start"] < first_done)]
    done_order = [ids.index(line["id"]) + 1 for line in lines if line["id"] in ids and line["outcome"] == "done"]
    # The claim of the three: the worker whose event 1 failed says its later events left it.
    errs = "".join(procs.output(name, "err") for name in names)
    tap.ok(statuses == [0, 0] and done_order == [1, 2, 3] and not too_early
           and "2 later events: they are no longer held" in errs and "was lost" not in errs,
           "strict order: after event 1 fails, events 2 and 3 are handled only after event 1 succeeded",
           f"exit {statuses}; handled (event, outcome) in order: {handled}; handled before event 1 "
           f"succeeded: {too_early}\n{errs}")
    cur.execute("""SELECT id, state, attempts, completed_by IS NOT NULL FROM throttle.event_history
                   WHERE id = ANY(%s) ORDER BY id""", (ids,))
    history = cur.fetchall()
    tap.is_([row[1:] for row in history], [("done", 2, True), ("done", 1, True), ("done", 1, True)],
            "strict order: each event done once in throttle.event_history, only event 1 tried twice")


def strict_handback(tap, procs, cur):
    """SIGTERM with --on-term handback under a claim of a group in strict
    order: the fail of the event being worked on sends the claim's later events
    back to pending, and the worker says so, without calling the claim lost."""
    queue = PREFIX + "strict-back"
    cur.execute("""INSERT INTO throttle.group_policy (queue, workers, strict_order) VALUES (%s, 1, true)
                   ON CONFLICT (queue) DO UPDATE SET workers = 1, strict_order = true""", (queue,))
    ids = [one(cur.connection, "SELECT throttle.schedule(%s, %s, now(), group_key => 'g')",
               (queue, f"step:{n}"))[0] for n in (1, 2, 3)]
    procs.worker("strict-back", queue, "--groups", "--on-term", "handback", "--work-ms", "30000", "--poll", "0.2")
    wait_until(lambda: one(cur.connection, "SELECT count(*) FROM throttle.event WHERE queue = %s "
                           "AND state = 'claimed'", (queue,))[0] == 3, 10)
    status = procs.terminate("strict-back")
    cur.execute("SELECT state, attempts, last_error FROM throttle.event WHERE id = ANY(%s) ORDER BY id", (ids,))
    rows = cur.fetchall()
    err = procs.output("strict-back", "err")
    tap.ok(status == 0 and rows == [("pending", 1, "worker stopping: handed back"),
                                    ("pending", 0, None), ("pending", 0, None)]
           and "2 of its 2 later events were no longer held" in err and "was lost" not in err,
           "SIGTERM under a strict claim: event 1 handed back, events 2 and 3 sent back by its fail "
           "(no attempt), and no claim called lost",
           f"exit {status}; (state, attempts, last_error) {rows}\n{err}")


LOST_WORK_S = 8                 # the job of lost_claim; its worker's lease is 1.5 s


def lost_claim(tap, procs, cur):
    """An operator releases the group under a worker's 8 s job: the heartbeat's
    extend renews nothing, the worker stops the job and neither completes nor
    fails it; a worker completes the event once."""
    queue = PREFIX + "lost"
    procs.worker("lost-1", queue, "--groups", "--lease", "1.5", "--work-ms", str(LOST_WORK_S * 1000),
                 "--poll", "0.2")
    event_id = one(cur.connection, "SELECT throttle.schedule(%s, 'job', now(), group_key => 'g')", (queue,))[0]
    wait_until(lambda: claimed_by(cur, queue, "lost-1"), 10)
    procs.worker("lost-2", queue, "--groups", "--poll", "0.1")
    released_at = time.time()
    released = one(cur.connection, "SELECT throttle.release_group(%s, 'g')", (queue,))[0]
    # Until the event is done and lost-1 has given up its job (the heartbeat
    # notices within lease/3, 0.5 s, on an idle machine).
    wait_until(lambda: one(cur.connection, "SELECT state FROM throttle.all_events WHERE id = %s",
                           (event_id,))[0] == "done"
               and any(line["worker"] == "lost-1" for line in log_lines(procs, "lost-1")), LOST_WORK_S + 10)
    lines = log_lines(procs, "lost-1", "lost-2")
    first = next((line for line in lines if line["id"] == event_id), None)
    stopped_in = first["end"] - released_at if first else None
    # Without the heartbeat the job would run its 8 s and end "done": stopping
    # within half of that leaves a slow machine 3.5 s over the 0.5 s beat.
    tap.ok(released == 1 and first and first["worker"] == "lost-1" and first["outcome"] == "cancelled"
           and stopped_in < LOST_WORK_S / 2 and "lost" in procs.output("lost-1", "err"),
           f"a claim lost to release_group: the heartbeat stops the job well before its end "
           f"({stopped_in if stopped_in is None else round(stopped_in, 2)} s after the release)",
           f"released {released}; first log line {first}; stopped {stopped_in} s after the release")
    cur.execute("""SELECT claimed_by, outcome FROM throttle.attempt_history
                   WHERE event_id = %s ORDER BY claimed_at""", (event_id,))
    attempts = cur.fetchall()
    outcomes = [line["outcome"] for line in lines if line["id"] == event_id]
    tap.ok(attempts[:1] == [("lost-1", "released")] and [a[1] for a in attempts[1:]] == ["completed"]
           and outcomes == ["cancelled", "done"],
           "the lost claim was neither completed nor failed; the event was completed once after it",
           f"attempts {attempts}; log outcomes {outcomes}")
    for name in ("lost-1", "lost-2"):
        procs.terminate(name)


def start_server(procs, name, rate, per, burst):
    """A ratelimit_server.py of this shape; its URL, or None when it did not start."""
    proc = procs.start(name, [SERVER, "--rate", str(rate), "--per", str(per), "--burst", str(burst),
                              "--port", "0", "--dsn", f"application_name=examples_python.{name}"])
    wait_until(lambda: "listening on" in procs.output(name) or proc.poll() is not None, 15)
    first = procs.output(name).split()
    return first[2] if proc.poll() is None and len(first) == 3 else None


def ratelimit(tap, procs, cur):
    # Rate 1 per 10 s, burst 3 (T = 10 s): the answers below hold however
    # slowly the requests come, as long as they come within 10 s.
    url = start_server(procs, "server", 1, 10, 3)
    # Rate 1 per 2 s, burst 1: to wait out a Retry-After.
    url2 = start_server(procs, "server2", 1, 2, 1)
    tap.ok(url and url2, "the servers listen on the ports they printed",
           procs.output("server", "err") + procs.output("server2", "err"))
    if not (url and url2):
        for _ in range(10):         # the checks below, failed
            tap.ok(False, "the servers started")
        return
    url, url2 = url + "hello", url2 + "hello"
    alice, bob, carol = (f"{name}-{os.getpid()}" for name in ("alice", "bob", "carol"))  # new buckets

    answers = check_burst(tap, url, alice)
    body = answers[3][2]
    tap.ok(answers[0][2] == {"path": "/hello", "client": f"key:{alice}"}
           and body.get("error") == "too many requests",
           "200 answers the application's body, 429 an error", f"{answers[0][2]!r} {answers[3][2]!r}")
    peek = one(cur.connection, "SELECT allowed, remaining FROM throttle.take(%s, 1, '10 seconds', 3, cost => 0)",
               ("http:key:" + alice,))
    tap.is_(peek, (False, 0), "the server took from the client's bucket in pg_throttle (a peek finds it empty)")
    tap.is_([limits(get(url, bob))[:3] for _ in range(2)], [(200, "3", "2"), (200, "3", "1")],
            "another X-Api-Key has a bucket of its own")
    # The address's bucket outlives a run: start it full.
    one(cur.connection, "SELECT throttle.reset('http:addr:127.0.0.1', 'bucket')")
    tap.is_([limits(get(url))[:3] for _ in range(2)], [(200, "3", "2"), (200, "3", "1")],
            "without X-Api-Key the client's address is the key")
    # take refuses a bucket name over 200 bytes: the client's error, not an outage.
    # Both derived from this run's key: a bucket no earlier run on this cluster has taken from.
    longest = f"{alice}-".ljust(200 - len("http:key:"), "k")
    too_long, at_limit = get(url, f"{alice}-".ljust(300, "k")), get(url, longest)
    tap.ok(too_long[0] == 400 and "too long" in too_long[2].get("error", "") and limits(at_limit)[:3] == (200, "3", "2"),
           "a 300-byte X-Api-Key gets 400; one that makes a 200-byte bucket name passes",
           f"300 bytes: {too_long[0]} {too_long[2]!r}; {len(longest)} bytes: {limits(at_limit)}")
    # The database away (the server's sessions ended under its pool): 503, failing
    # closed; the pool then opens a new connection and the limit is back.
    # (pg_terminate_backend waits up to 5 s for each session to end.)
    cur.execute("""SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity
                   WHERE application_name = 'examples_python.server'""")
    ended = cur.fetchone()[0]
    down, back = get(url, f"dave-{os.getpid()}"), get(url, f"dave-{os.getpid()}")
    tap.ok(ended >= 1 and (down[0], down[1].get("Retry-After")) == (503, "1")
           and limits(back)[:3] == (200, "3", "2"),
           "its database connections gone, the server answers 503 with Retry-After 1, then 200 again",
           f"sessions ended {ended}; {down[0]} {down[2]!r}; then {limits(back)}")
    check_wait_out(tap, url2, carol)
    tap.is_([procs.terminate("server"), procs.terminate("server2")], [0, 0], "the servers exit 0 on SIGTERM")


def main():
    tap = Tap(31)
    conn = connect()
    cur = conn.cursor()
    # Leftovers of an earlier run on this cluster.
    cur.execute("DELETE FROM throttle.event_attempt WHERE event_id IN "
                "(SELECT id FROM throttle.all_events WHERE queue LIKE %s)", (PREFIX + "%",))
    cur.execute("DELETE FROM throttle.event WHERE queue LIKE %s", (PREFIX + "%",))
    cur.execute("DELETE FROM throttle.event_history WHERE queue LIKE %s", (PREFIX + "%",))
    cur.execute("DELETE FROM throttle.group_policy WHERE queue LIKE %s", (PREFIX + "%",))
    with tempfile.TemporaryDirectory(prefix="examples_python.") as tmp:
        procs = Processes(tmp)
        try:
            drain(tap, procs, cur)
            listen(tap, procs, cur)
            sigterm_finish(tap, procs, cur)
            sigterm_handback(tap, procs, cur)
            strict_handback(tap, procs, cur)
            lost_claim(tap, procs, cur)
            strict_order(tap, procs, cur)
            ratelimit(tap, procs, cur)
        finally:
            procs.kill_all()
    conn.close()
    tap.done()


if __name__ == "__main__":
    main()
