#!/usr/bin/python3
"""The Python client examples (examples/python, psycopg 3) run for real.

queue_worker.py: three worker processes per queue drain 300 events (claim) and
40 groups of 5 (claim_group), some failing once; every event is completed
exactly once, in the workers' logs and in the tables, and no group is worked on
by two workers at once. LISTEN wakes an idle worker at once; the heartbeat keeps
a long job's claim; SIGTERM finishes or hands back the job and exits 0; a claim
lost to release_group is dropped, never completed.

ratelimit_server.py: real HTTP requests get 200 while the bucket has units and
429 with Retry-After after, with the RateLimit-* headers on every answer.
"""
import collections
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one  # noqa: E402
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


def wait_until(condition, timeout, step=0.02):
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)


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


def sigterm_finish(tap, procs, cur):
    """SIGTERM in the middle of a 3 s job with a 1 s lease: the heartbeat keeps
    the claim (a second, eager worker never gets the event), the job finishes
    and is completed, and the stopping worker claims nothing more."""
    queue = PREFIX + "long"
    procs.worker("long-1", queue, "--lease", "1", "--work-ms", "3000", "--poll", "0.2")
    event_id = one(cur.connection, "SELECT throttle.schedule(%s, 'long', now())", (queue,))[0]
    wait_until(lambda: claimed_by(cur, queue, "long-1"), 10)
    procs.worker("long-2", queue, "--lease", "1", "--poll", "0.1")
    time.sleep(1.2)             # past the first lease: only extend keeps it
    signalled = time.time()
    status = procs.terminate("long-1")
    after_id = one(cur.connection, "SELECT throttle.schedule(%s, 'after', now())", (queue,))[0]
    wait_until(lambda: one(cur.connection, "SELECT state FROM throttle.all_events WHERE id = %s",
                           (after_id,))[0] == "done", 10)
    tap.is_(status, 0, "SIGTERM during a job: the worker finishes it and exits 0")
    row = one(cur.connection, """SELECT state, attempts, completed_by,
                                        (SELECT count(*) FROM throttle.event_attempt WHERE event_id = %s)
                                 FROM throttle.all_events WHERE id = %s""", (event_id, event_id))
    lines = [(line["worker"], line["outcome"], line["end"] > signalled, line["end"] - line["start"] >= 2.9)
             for line in log_lines(procs, "long-1", "long-2") if line["id"] == event_id]
    tap.ok(row == ("done", 1, "long-1", 0) and lines == [("long-1", "done", True, True)],
           "the heartbeat kept the claim past its lease and the job was completed once, after the SIGTERM",
           f"(state, attempts, completed_by, ended attempts) {row}; log (worker, outcome, ended after "
           f"SIGTERM, took 3 s) {lines}")
    tap.is_(one(cur.connection, "SELECT completed_by FROM throttle.all_events WHERE id = %s", (after_id,))[0],
            "long-2", "a stopping worker claims nothing more: the next event went to the other worker")
    procs.terminate("long-2")


def sigterm_handback(tap, procs, cur):
    """With --on-term handback, SIGTERM stops a 5 s job at once and fails the
    event back with retry_in 0: the other worker completes it."""
    queue = PREFIX + "handback"
    procs.worker("back-1", queue, "--on-term", "handback", "--lease", "2", "--work-ms", "5000", "--poll", "0.2")
    event_id = one(cur.connection, "SELECT throttle.schedule(%s, 'long', now())", (queue,))[0]
    wait_until(lambda: claimed_by(cur, queue, "back-1"), 10)
    procs.worker("back-2", queue, "--poll", "0.2")
    t0 = time.monotonic()
    status = procs.terminate("back-1")
    took = time.monotonic() - t0
    tap.ok(status == 0 and took < 2, f"SIGTERM with --on-term handback: the worker exits 0 in {took:.1f} s",
           f"status {status}")
    wait_until(lambda: one(cur.connection, "SELECT state FROM throttle.all_events WHERE id = %s",
                           (event_id,))[0] == "done", 10)
    cur.execute("""SELECT claimed_by, outcome, error FROM throttle.attempt_history
                   WHERE event_id = %s ORDER BY claimed_at""", (event_id,))
    attempts = cur.fetchall()
    lines = [(line["worker"], line["outcome"]) for line in log_lines(procs, "back-1", "back-2")
             if line["id"] == event_id]
    tap.ok(attempts == [("back-1", "failed", "worker stopping: handed back"), ("back-2", "completed", None)]
           and lines == [("back-1", "cancelled"), ("back-2", "done")],
           "the handed-back event was completed once, by the other worker",
           f"attempts {attempts}; log {lines}")
    procs.terminate("back-2")


def lost_claim(tap, procs, cur):
    """An operator releases the group under a worker's 4 s job: the heartbeat's
    extend renews nothing, the worker stops the job and neither completes nor
    fails it; a worker completes the event once."""
    queue = PREFIX + "lost"
    procs.worker("lost-1", queue, "--groups", "--lease", "1.5", "--work-ms", "4000", "--poll", "0.2")
    event_id = one(cur.connection, "SELECT throttle.schedule(%s, 'job', now(), group_key => 'g')", (queue,))[0]
    wait_until(lambda: claimed_by(cur, queue, "lost-1"), 10)
    procs.worker("lost-2", queue, "--groups", "--poll", "0.1")
    released_at = time.time()
    released = one(cur.connection, "SELECT throttle.release_group(%s, 'g')", (queue,))[0]
    # Until the event is done and lost-1 has given up its job (the heartbeat
    # notices within lease/3, 0.5 s).
    wait_until(lambda: one(cur.connection, "SELECT state FROM throttle.all_events WHERE id = %s",
                           (event_id,))[0] == "done"
               and any(line["worker"] == "lost-1" for line in log_lines(procs, "lost-1")), 15)
    lines = log_lines(procs, "lost-1", "lost-2")
    first = next((line for line in lines if line["id"] == event_id), None)
    stopped_in = first["end"] - released_at if first else None
    tap.ok(released == 1 and first and first["worker"] == "lost-1" and first["outcome"] == "cancelled"
           and stopped_in < 1.0 and "lost" in procs.output("lost-1", "err"),
           "a claim lost to release_group: the heartbeat stops the job within lease/3",
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


def get(url, api_key=None):
    """A GET; (status, headers, body) for 200 and for 429 alike."""
    request = urllib.request.Request(url, headers={"X-Api-Key": api_key} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def ratelimit(tap, procs, cur):
    proc = procs.start("server", [SERVER, "--rate", "2", "--per", "1", "--burst", "3", "--port", "0"])
    wait_until(lambda: "listening on" in procs.output("server") or proc.poll() is not None, 15)
    first = procs.output("server").split()
    tap.ok(proc.poll() is None and len(first) == 3, "the server listens on the port it printed",
           procs.output("server", "err") + str(first))
    url = first[2] + "hello"
    alice, bob = f"alice-{os.getpid()}", f"bob-{os.getpid()}"   # new buckets on every run

    def summary(answer):
        status, headers, _ = answer
        return (status, headers.get("RateLimit-Limit"), headers.get("RateLimit-Remaining"),
                headers.get("RateLimit-Reset"), headers.get("Retry-After"))

    t0 = time.monotonic()
    answers = [get(url, alice) for _ in range(4)]
    took = time.monotonic() - t0
    # rate 2 per second, burst 3: T = 0.5 s. The bucket is full again 0.5 s
    # after the first take, 1.5 s after the third; the 4th would pass 0.5 s
    # after the first: Retry-After 1 (rounded up), Reset 2.
    tap.is_([summary(a) for a in answers],
            [(200, "3", "2", "1", None), (200, "3", "1", "1", None), (200, "3", "0", "2", None),
             (429, "3", "0", "2", "1")],
            f"burst 3: three 200s with RateLimit-Remaining 2, 1, 0, then 429 with Retry-After 1 ({took:.2f} s)")
    body = json.loads(answers[0][2])
    tap.ok(body == {"path": "/hello", "client": f"key:{alice}"} and b"too many" in answers[3][2],
           "200 answers the application's body, 429 an error", f"{answers[0][2]!r} {answers[3][2]!r}")
    peek = one(cur.connection, "SELECT allowed, remaining FROM throttle.take(%s, 2, '1 second', 3, cost => 0)",
               ("http:key:" + alice,))
    tap.is_(peek, (False, 0), "the server took from the client's bucket in pg_throttle (a peek finds it empty)")
    tap.is_([summary(get(url, bob))[:3] for _ in range(2)], [(200, "3", "2"), (200, "3", "1")],
            "another X-Api-Key has a bucket of its own")
    tap.is_(summary(get(url))[:3], (200, "3", "2"), "without X-Api-Key the client's address is the key")
    time.sleep(int(answers[3][1]["Retry-After"]))
    tap.is_(summary(get(url, alice))[0], 200, "after Retry-After seconds the client is let through again")
    tap.is_(procs.terminate("server"), 0, "the server exits 0 on SIGTERM")


def main():
    tap = Tap(25)
    conn = connect()
    cur = conn.cursor()
    # Leftovers of an earlier run on this cluster.
    cur.execute("DELETE FROM throttle.event_attempt WHERE event_id IN "
                "(SELECT id FROM throttle.all_events WHERE queue LIKE %s)", (PREFIX + "%",))
    cur.execute("DELETE FROM throttle.event WHERE queue LIKE %s", (PREFIX + "%",))
    cur.execute("DELETE FROM throttle.event_history WHERE queue LIKE %s", (PREFIX + "%",))
    with tempfile.TemporaryDirectory(prefix="examples_python.") as tmp:
        procs = Processes(tmp)
        try:
            drain(tap, procs, cur)
            listen(tap, procs, cur)
            sigterm_finish(tap, procs, cur)
            sigterm_handback(tap, procs, cur)
            lost_claim(tap, procs, cur)
            ratelimit(tap, procs, cur)
        finally:
            procs.kill_all()
    conn.close()
    tap.done()


if __name__ == "__main__":
    main()
