#!/usr/bin/python3
"""The Node.js examples (examples/node, node-postgres) against the cluster:
queue workers drain a plain and a grouped queue, every event completed exactly
once (checked in the workers' logs and in throttle.event_history), no group on
two workers at once, LISTEN wakes an idle worker, a lost claim is not
completed, SIGTERM finishes or hands back the work, in a group in strict order
the events behind a failed one wait for its retry; the HTTP server answers
200/429 with the RateLimit headers and Retry-After of throttle.take, 400 to an
X-Api-Key too long for a bucket name and to a request whose connection is gone.

Needs node and npm (Debian's nodejs and npm, or the machine's Node); runs
`npm ci` in examples/node when its node_modules lacks a version package-lock.json
names.
"""
import collections
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one  # noqa: E402
from polling import wait_until  # noqa: E402
from ratelimit_http import check_burst, check_wait_out, get, limits  # noqa: E402
from tap import Tap  # noqa: E402

EXAMPLES = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                         "examples", "node"))
JOBS, GROUPS = "it.node.jobs", "it.node.groups"
QUEUES = [JOBS, GROUPS, "it.node.listen", "it.node.lost", "it.node.term", "it.node.handback", "it.node.strict"]

running = []   # every Node process started, killed (with its process group) on every exit


class Node:
    """A Node program of examples/node in a process group of its own; stdout is read
    line by line, stderr goes to a file shown when something fails."""

    def __init__(self, script, args, tmp, name):
        self.name = name
        self.stderr_path = os.path.join(tmp, f"{name}.stderr")
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(["node", script, *args], cwd=EXAMPLES, stdout=subprocess.PIPE,
                                         stderr=err, text=True, start_new_session=True)
        running.append(self)

    def wait_line(self, pattern, timeout):
        """The first stdout line matching `pattern` within `timeout` seconds, or None."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                break
            line = self.proc.stdout.readline()
            if not line:
                return None
            if m := re.search(pattern, line):
                return m
        return None

    def signal(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout):
        """Its exit code, or None when it is still running after `timeout` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stderr(self):
        with open(self.stderr_path) as f:
            return f.read()

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.proc.stdout.close()


def worker(tmp, queue, name, *args):
    log = os.path.join(tmp, f"{name}.jsonl")
    node = Node("queue_worker.js", ["--queue", queue, "--worker", name, "--log", log, *args], tmp, name)
    node.log = log
    return node


def read_log(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def open_work(conn, queues):
    return one(conn, "SELECT count(*) FROM throttle.event WHERE queue = ANY(%s) AND state IN ('pending', 'claimed')",
               (queues,))[0]


def claimed_by(conn, queue, name):
    return one(conn, "SELECT count(*) FROM throttle.event WHERE queue = %s AND state = 'claimed' AND claimed_by = %s",
               (queue, name))[0]


def stop_all(nodes, timeout=15):
    """SIGTERM, then the exit codes (None: did not exit)."""
    for n in nodes:
        n.signal(signal.SIGTERM)
    return [n.wait(timeout) for n in nodes]


def not_installed():
    """The dependencies package-lock.json names that node_modules lacks, or holds in
    another version: [(path, locked version, installed version)]."""
    with open(os.path.join(EXAMPLES, "package-lock.json")) as f:
        lock = json.load(f)
    wrong = []
    for path, entry in lock["packages"].items():
        if not path or entry.get("dev") or entry.get("link"):
            continue                    # the examples themselves, or not needed to run them
        try:
            with open(os.path.join(EXAMPLES, path, "package.json")) as f:
                have = json.load(f).get("version")
        except FileNotFoundError:
            if entry.get("optional"):
                continue                # npm skips an optional one this platform cannot use
            have = None
        if have != entry.get("version"):
            wrong.append((path, entry.get("version"), have))
    return wrong


def npm_ci(tap):
    wrong = not_installed()
    output = ""
    if wrong:
        if not shutil.which("npm") or not shutil.which("node"):
            print("Bail out! node and npm are needed (Debian packages nodejs and npm)", flush=True)
            sys.exit(1)
        run = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=EXAMPLES, capture_output=True,
                             text=True)
        output = f"npm ci exited {run.returncode}: {run.stdout}{run.stderr}"
        wrong = not_installed()
    tap.ok(not wrong, "examples/node/node_modules holds the versions package-lock.json names"
           + (" (after npm ci)" if output else ""), f"missing or other versions: {wrong}\n{output}")
    if wrong:
        print("Bail out! examples/node's dependencies are not installed", flush=True)
        sys.exit(1)


def test_workers(tap, conn, tmp):
    """3 workers per queue drain 300 plain events and 40 groups of 5."""
    # Every 10th job fails on its first attempt, and the first event of every 10th group.
    one(conn, """SELECT count(throttle.schedule(%s, 'job:' || n, now(),
                                             CASE WHEN n %% 10 = 0 THEN '{"fail": true}' ELSE '{}' END::jsonb))
                 FROM generate_series(1, 300) AS n""", (JOBS,))
    one(conn, """SELECT count(throttle.schedule(%s, 'ev:' || g || ':' || i, now() + i * interval '1 ms',
                                             CASE WHEN g %% 10 = 0 AND i = 1 THEN '{"fail": true}' ELSE '{}' END::jsonb,
                                             group_key => 'customer:' || g))
                 FROM generate_series(1, 40) AS g, generate_series(1, 5) AS i""", (GROUPS,))
    scheduled = {r[0]: r[1:] for r in _rows(conn, """
        SELECT id, queue, item_key, group_key, coalesce((payload->>'fail')::boolean, false)
        FROM throttle.event WHERE queue = ANY(%s)""", ([JOBS, GROUPS],))}
    tap.is_(len(scheduled), 500, "500 events scheduled: 300 jobs, 40 groups of 5")

    common = ["--poll", "1", "--retry-in", "1", "--lease", "10"]
    nodes = [worker(tmp, JOBS, f"jobs-{i}", "--max", "10", "--work-ms", "5", *common) for i in range(3)]
    nodes += [worker(tmp, GROUPS, f"groups-{i}", "--groups", "--work-ms", "20", *common) for i in range(3)]
    t0 = time.monotonic()
    left = wait_until(lambda: open_work(conn, [JOBS, GROUPS]) == 0, 40, 0.2)
    took = time.monotonic() - t0
    tap.ok(left, f"the workers drained both queues ({took:.1f} s)",
           f"{open_work(conn, [JOBS, GROUPS])} events pending or claimed")
    codes = stop_all(nodes)
    tap.is_(codes, [0] * 6, "every worker exits 0 on SIGTERM")
    if codes != [0] * 6:
        for n in nodes:
            print(f"# {n.name}: {n.stderr()}", flush=True)

    runs = [r for n in nodes for r in read_log(n.log)]
    ok_runs = collections.Counter(int(r["id"]) for r in runs if not r["failed"])
    failing = {i for i, (_, _, _, fail) in scheduled.items() if fail}
    tap.ok(set(ok_runs) == set(scheduled) and set(ok_runs.values()) == {1},
           "the logs: every event handled successfully exactly once",
           f"{len(ok_runs)} of {len(scheduled)} events; more than once: "
           f"{[i for i, c in ok_runs.items() if c > 1][:10]}")
    by_event = collections.defaultdict(list)
    for r in sorted(runs, key=lambda r: r["start"]):
        by_event[int(r["id"])].append((r["attempt"], r["failed"]))
    wrong = {i: by_event[i] for i in scheduled
             if by_event[i] != ([(1, True), (2, False)] if i in failing else [(1, False)])}
    tap.ok(failing and not wrong,
           f"the logs: the {len(failing)} failing events failed on attempt 1, then succeeded on attempt 2; "
           "the others succeeded on attempt 1", f"runs (attempt, failed) of events: {dict(list(wrong.items())[:10])}")

    history = {r[0]: r[1:] for r in _rows(conn, """
        SELECT id, state, attempts, completed_by FROM throttle.event_history WHERE queue = ANY(%s)""",
        ([JOBS, GROUPS],))}
    attempts = _rows(conn, """
        SELECT a.event_id, a.outcome FROM throttle.event_attempt a
        JOIN throttle.all_events e ON e.id = a.event_id WHERE e.queue = ANY(%s)""", ([JOBS, GROUPS],))
    tap.ok(set(history) == set(scheduled)
           and all(h[0] == "done" and h[1] == (2 if i in failing else 1) for i, h in history.items())
           and sorted(attempts) == sorted((i, "failed") for i in failing),
           "event_history: every event done, the failing ones after one failed attempt, no attempt lost",
           f"{len(history)} in history; not done or wrong attempts: "
           f"{[(i, h) for i, h in history.items() if h[0] != 'done' or h[1] != (2 if i in failing else 1)][:10]}; "
           f"attempt rows: {len(attempts)}")
    logged_by = {int(r["id"]): r["worker"] for r in runs if not r["failed"]}
    wrong = [i for i, h in history.items() if h[2] != logged_by.get(i)]
    tap.ok(not wrong, "event_history: each event completed by the worker whose log shows its run",
           f"{wrong[:10]}")

    by_group = collections.defaultdict(list)
    for r in runs:
        if r["group_key"] is not None:
            by_group[r["group_key"]].append(r)
    overlaps = [(g, a["worker"], b["worker"]) for g, rs in by_group.items() for a in rs for b in rs
                if a["worker"] != b["worker"] and a["start"] <= b["start"] < a["end"]]
    tap.ok(len(by_group) == 40 and not overlaps, "no two workers on one group at overlapping times",
           f"{len(by_group)} groups logged; overlaps: {overlaps[:10]}")
    busy = {q: {r["worker"] for r in runs if r["worker"].startswith(q)} for q in ("jobs", "groups")}
    tap.ok(all(len(w) > 1 for w in busy.values()), "in each queue, more than one worker took events",
           repr(busy))


def test_listen(tap, conn, tmp):
    """An idle worker that polls every 30 s gets a due event within a second."""
    queue = "it.node.listen"
    w = worker(tmp, queue, "listen-0", "--poll", "30", "--work-ms", "0")
    ready = w.wait_line(r"^ready", 15)
    time.sleep(0.3)   # it is asleep in its 30 s poll interval now
    scheduled_ms = time.time() * 1000
    one(conn, "SELECT throttle.schedule(%s, 'wake', now())", (queue,))
    run = wait_until(lambda: read_log(w.log), 5)
    latency = (run[0]["start"] - scheduled_ms) / 1000 if run else None
    tap.ok(ready and latency is not None and latency < 1.0,
           "LISTEN wakes an idle worker (polling every 30 s) within 1 s"
           f" ({'never' if latency is None else f'{latency * 1000:.0f} ms'})", w.stderr())
    stop_all([w])


def test_strict_order(tap, conn, tmp):
    """A group in strict order whose first event fails once: the fail hands the claim's
    later events back, to run after its retry. The workers must leave them, not handle
    them out of order."""
    queue = "it.node.strict"
    with conn.cursor() as cur:
        cur.execute("""INSERT INTO throttle.group_policy (queue, workers, strict_order) VALUES (%s, 1, true)
                       ON CONFLICT (queue) DO UPDATE SET workers = 1, strict_order = true""", (queue,))
    # From one session, one after the other: the ids give the order.
    ids = [one(conn, "SELECT throttle.schedule(%s, %s, now(), %s::jsonb, group_key => 'g')",
               (queue, f"step:{n}", payload))[0]
           for n, payload in enumerate(['{"fail": true}', '{}', '{}'], 1)]
    nodes = [worker(tmp, queue, f"strict-{i}", "--groups", "--poll", "0.2", "--retry-in", "0.3",
                    "--work-ms", "20") for i in range(2)]
    wait_until(lambda: one(conn, "SELECT count(*) FROM throttle.event_history WHERE id = ANY(%s)",
                           (ids,))[0] == 3, 20, 0.05)
    codes = stop_all(nodes)
    runs = sorted((r for n in nodes for r in read_log(n.log) if int(r["id"]) in ids), key=lambda r: r["start"])
    step = {event_id: n for n, event_id in enumerate(ids, 1)}
    handled = [(step[int(r["id"])], "failed" if r["failed"] else "ok") for r in runs]
    first_ok = next((r["end"] for r in runs if int(r["id"]) == ids[0] and not r["failed"]), None)
    too_early = [(step[int(r["id"])], r["worker"]) for r in runs
                 if int(r["id"]) != ids[0] and (first_ok is None or r["start"] < first_ok)]
    ok_order = [step[int(r["id"])] for r in runs if not r["failed"]]
    # The claim of the three: the worker whose event 1 failed says its later events left it,
    # without calling the claim lost.
    errs = "".join(n.stderr() for n in nodes)
    tap.ok(codes == [0, 0] and ok_order == [1, 2, 3] and not too_early
           and "2 later events: they are no longer held" in errs and " lost (" not in errs,
           "strict order: after event 1 fails, events 2 and 3 are handled only after event 1 succeeded",
           f"exit {codes}; handled (event, outcome) in order: {handled}; handled before event 1 succeeded: "
           f"{too_early}\n{errs}")
    history = _rows(conn, """SELECT state, attempts, completed_by IS NOT NULL FROM throttle.event_history
                             WHERE id = ANY(%s) ORDER BY id""", (ids,))
    tap.is_(history, [("done", 2, True), ("done", 1, True), ("done", 1, True)],
            "strict order: each event done once in throttle.event_history, only event 1 tried twice")


def test_lost_claim(tap, conn, tmp):
    """release_group fences a running claim: the heartbeat's extend returns 0, the worker
    stops the work and does not complete it; the event runs again, once."""
    queue = "it.node.lost"
    event = one(conn, "SELECT throttle.schedule(%s, 'lost', now(), group_key => 'g')", (queue,))[0]
    w = worker(tmp, queue, "lost-0", "--groups", "--lease", "1.5", "--work-ms", "2500", "--poll", "0.5")
    claimed = wait_until(lambda: claimed_by(conn, queue, "lost-0"), 10)
    time.sleep(0.2)
    one(conn, "SELECT throttle.release_group(%s, 'g')", (queue,))
    done = wait_until(lambda: one(conn, "SELECT state FROM throttle.all_events WHERE id = %s",
                                  (event,))[0] == "done", 15, 0.1)
    code = stop_all([w])[0]
    log = read_log(w.log)
    history = _rows(conn, "SELECT attempt, outcome FROM throttle.attempt_history WHERE event_id = %s "
                          "ORDER BY claimed_at", (event,))
    tap.ok(claimed and done and code == 0 and [(r["attempt"], r["failed"]) for r in log] == [(2, False)]
           and history == [(1, "released"), (2, "completed")] and "lost" in w.stderr(),
           "a lost claim is abandoned, not completed; its event runs again once",
           f"log: {log}\nhistory: {history}\nexit: {code}\n{w.stderr()}")


def test_sigterm(tap, conn, tmp):
    """SIGTERM during a 3 s job with a 1.5 s lease: the heartbeat keeps the claim (an idle
    second worker would take an expired one over), the job completes once, exit 0."""
    queue = "it.node.term"
    event = one(conn, "SELECT throttle.schedule(%s, 'long', now())", (queue,))[0]
    busy = worker(tmp, queue, "term-0", "--lease", "1.5", "--work-ms", "3000", "--poll", "0.2")
    claimed = wait_until(lambda: claimed_by(conn, queue, "term-0"), 10)
    other = worker(tmp, queue, "term-1", "--lease", "1.5", "--work-ms", "0", "--poll", "0.2")
    time.sleep(0.5)
    busy.signal(signal.SIGTERM)
    code = busy.wait(15)
    state = one(conn, "SELECT state, attempts, completed_by FROM throttle.all_events WHERE id = %s", (event,))
    stop_all([other])
    runs = read_log(busy.log) + read_log(other.log)
    extra = one(conn, "SELECT count(*) FROM throttle.event_attempt WHERE event_id = %s", (event,))[0]
    tap.ok(claimed and code == 0 and state == ("done", 1, "term-0") and extra == 0
           and [(r["worker"], r["failed"]) for r in runs] == [("term-0", False)],
           "SIGTERM during a long job: it completes once, the worker exits 0",
           f"exit: {code}\nstate: {state}\nruns: {runs}\n{busy.stderr()}")


def test_hand_back(tap, conn, tmp):
    """A second SIGTERM aborts the job and hands the event back at once."""
    queue = "it.node.handback"
    event = one(conn, "SELECT throttle.schedule(%s, 'long', now())", (queue,))[0]
    w = worker(tmp, queue, "back-0", "--work-ms", "30000")
    claimed = wait_until(lambda: claimed_by(conn, queue, "back-0"), 10)
    w.signal(signal.SIGTERM)
    # Two signals that arrive before node runs its handler would merge into one: send the
    # second only once the worker has said it took the first.
    first_seen = wait_until(lambda: "finishing the events held" in w.stderr(), 10)
    t0 = time.monotonic()
    w.signal(signal.SIGTERM)
    code = w.wait(10)
    took = time.monotonic() - t0
    state = one(conn, "SELECT state, attempts, last_error, run_at <= now() FROM throttle.event WHERE id = %s",
                (event,))
    # The row shows the hand-back (pending, due at once); the time only has to show that the
    # 30 s job did not run to its end, and includes node's exit.
    tap.ok(claimed and first_seen and code == 0 and took < 10 and read_log(w.log) == []
           and state == ("pending", 1, "worker shutting down", True),
           f"a second SIGTERM hands the event back, due at once, and exits 0 ({took:.1f} s)",
           f"exit: {code}\nstate: {state}\n{w.stderr()}")


def start_server(tmp, name, rate, per, burst):
    """A ratelimit_server.js of this shape, and its port (None when it did not start)."""
    server = Node("ratelimit_server.js", ["--port", "0", "--rate", str(rate), "--per", str(per),
                                          "--burst", str(burst)], tmp, name)
    m = server.wait_line(r"listening on http://127\.0\.0\.1:(\d+)", 15)
    return server, int(m.group(1)) if m else None


def send_then_reset(port, count):
    """`count` requests, each on a connection the client resets (SO_LINGER 0) right after
    sending it. The caller has stopped the server: it reads each request only after its
    connection was reset, when the socket no longer has a peer address."""
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /closed HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


HTTP_TESTS = 7


def test_http(tap, conn, tmp):
    # Rate 1 per 10 s, burst 3 (T = 10 s): the answers below hold however slowly the
    # requests come, as long as they come within 10 s.
    server, port = start_server(tmp, "http", 1, 10, 3)
    # Rate 1 per 2 s, burst 1: to wait out a Retry-After.
    server2, port2 = start_server(tmp, "http2", 1, 2, 1)
    if not (port and port2):
        for _ in range(HTTP_TESTS):
            tap.ok(False, "the HTTP servers started", server.stderr() + server2.stderr())
        return
    url, url2 = f"http://127.0.0.1:{port}/hello", f"http://127.0.0.1:{port2}/hello"
    key = f"it-{os.getpid()}-{time.time()}"   # a bucket no earlier run has touched
    check_burst(tap, url, key)

    # The address's bucket outlives a run: start it full.
    one(conn, "SELECT throttle.reset('api:addr:127.0.0.1', 'bucket')")
    others = [limits(get(url, f"{key}-other"))[:3], limits(get(url, f"{key}-other"))[:3],
              limits(get(url))[:3]]
    tap.is_(others, [(200, "3", "2"), (200, "3", "1"), (200, "3", "2")],
            "another X-Api-Key, and a request without one, have buckets of their own")

    # take refuses a bucket name over 200 bytes: the client's error, not an outage.
    # Both derived from this run's key: a bucket no earlier run on this cluster has taken from.
    longest = f"{key}-".ljust(200 - len("api:key:"), "k")
    too_long, at_limit = get(url, f"{key}-".ljust(300, "k")), get(url, longest)
    tap.ok(too_long[0] == 400 and "too long" in too_long[2].get("error", "")
           and limits(at_limit)[:3] == (200, "3", "2"),
           "a 300-byte X-Api-Key gets 400; one that makes a 200-byte bucket name passes",
           f"300 bytes: {too_long[0]} {too_long[2]}; {len(longest)} bytes: {limits(at_limit)}")

    # Requests read after their connection was reset have no remoteAddress: they must not
    # share one bucket named after "undefined".
    one(conn, "SELECT throttle.reset('api:addr:undefined', 'bucket')")

    def undefined_bucket():
        return one(conn, "SELECT count(*) FROM throttle.status WHERE name = 'api:addr:undefined'")[0]
    server.signal(signal.SIGSTOP)
    try:
        send_then_reset(port, 3)
    finally:
        server.signal(signal.SIGCONT)
    # Until the three are refused, or (the defect) one of them made the bucket.
    wait_until(lambda: server.stderr().count("no client address") >= 3 or undefined_bucket(), 10)
    refused, bucket = server.stderr().count("no client address"), undefined_bucket()
    tap.ok(refused == 3 and bucket == 0,
           "a request whose connection is gone is refused, not counted in an 'api:addr:undefined' bucket",
           f"refusals logged: {refused}; 'api:addr:undefined' buckets: {bucket}\n{server.stderr()}")

    # A key of its own: a bucket's state is kept by its name, whatever shape takes from it.
    check_wait_out(tap, url2, f"{key}-again")
    tap.is_(stop_all([server, server2]), [0, 0], "the servers exit 0 on SIGTERM")


def _rows(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def main():
    # prove or a CI timeout stops the test with SIGTERM: unwind, so that `finally` kills the workers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    tap = Tap(23)
    conn = connect()
    tmp = tempfile.mkdtemp(prefix="examples_node.")
    try:
        npm_ci(tap)
        # Start from empty queues, so that the test can run again on the same cluster.
        one(conn, """WITH gone AS (DELETE FROM throttle.event_history WHERE queue = ANY(%(q)s) RETURNING id),
                          hot AS (DELETE FROM throttle.event WHERE queue = ANY(%(q)s) RETURNING id),
                          tried AS (DELETE FROM throttle.event_attempt
                                    WHERE event_id IN (SELECT id FROM gone UNION ALL SELECT id FROM hot)
                                    RETURNING 1)
                     SELECT count(*) FROM tried""", {"q": QUEUES})
        one(conn, "WITH gone AS (DELETE FROM throttle.group_policy WHERE queue = ANY(%s) RETURNING 1) "
                  "SELECT count(*) FROM gone", (QUEUES,))
        test_workers(tap, conn, tmp)
        test_listen(tap, conn, tmp)
        test_lost_claim(tap, conn, tmp)
        test_sigterm(tap, conn, tmp)
        test_hand_back(tap, conn, tmp)
        test_strict_order(tap, conn, tmp)
        test_http(tap, conn, tmp)
    finally:
        for n in running:
            n.kill()
        shutil.rmtree(tmp, ignore_errors=True)
        conn.close()
    tap.done()


if __name__ == "__main__":
    main()
