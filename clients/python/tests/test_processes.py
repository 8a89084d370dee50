"""Several worker processes drain one queue; one is SIGKILLed in the middle of
a job: its event is taken over once its lease ends, and every event is
completed exactly once (the workers' logs and throttle.event_history)."""
import collections
import json
import os
import signal
import subprocess
import sys
import time

import pg_throttle
from conftest import wait_until

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_prog.py")
LEASE = 1.5


def read_log(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def start(tmp_path, queue, worker, log, gate=0, abort_grace=2):
    proc = subprocess.Popen([sys.executable, PROGRAM, queue, worker, log, str(LEASE), str(gate), str(abort_grace)],
                            stdout=subprocess.PIPE, stderr=open(tmp_path / f"{worker}.err", "w"),
                            text=True, start_new_session=True)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise AssertionError((tmp_path / f"{worker}.err").read_text())
    return proc


def test_processes_and_a_sigkill(conn, name, tmp_path):
    log = str(tmp_path / "log")
    events = [{"item_key": f"job:{n}", "payload": {"hang": n == 5}} for n in range(60)]
    procs = {}
    try:
        for n in range(3):
            procs[f"{name}-{n}"] = start(tmp_path, name, f"{name}-{n}", log, gate=3)
        # Scheduled once all three listen, and each worker's first handlers wait
        # until the three have started one (the gate): each has its share,
        # whatever the timing (one that started first would otherwise drain
        # most of the queue alone).
        ids = pg_throttle.schedule_many(conn, name, events)
        hang_id = ids[5]

        def hanging():
            return [line for line in read_log(log) if line["id"] == hang_id and line["what"] == "start"]
        assert wait_until(hanging, 15)
        victim = hanging()[0]["worker"]
        procs[victim].send_signal(signal.SIGKILL)
        killed_at = time.time()
        assert procs[victim].wait(10) == -signal.SIGKILL

        def left():
            return conn.execute("SELECT count(*) FROM throttle.event WHERE queue = %s", (name,)).fetchone()[0]
        assert wait_until(lambda: left() == 0, 30), left()
        for worker, proc in procs.items():
            if worker != victim:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(10) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    lines = read_log(log)
    rows = conn.execute("SELECT id, state, completed_by FROM throttle.all_events WHERE queue = %s", (name,)).fetchall()
    completed_by = {r[0]: r[2] for r in rows}
    # The SIGKILL may land between a handler's return and its complete on
    # the victim's other thread: that run is logged "done" but its attempt
    # expired and another worker ran the event again (at least once, by
    # design). Such a line is the only duplicate allowed, and the check below
    # proves it is one.
    casualties = [line for line in lines if line["what"] == "done" and line["worker"] == victim
                  and completed_by.get(line["id"]) != victim]
    for line in casualties:
        history = conn.execute("SELECT claimed_by, outcome FROM throttle.attempt_history WHERE event_id = %s"
                               " ORDER BY claimed_at", (line["id"],)).fetchall()
        assert line["at"] <= killed_at and [(h[0] == victim, h[1]) for h in history] == [
            (True, "expired"), (False, "completed")], (line, history)
    done = collections.Counter(line["id"] for line in lines if line["what"] == "done" and line not in casualties)
    assert done == collections.Counter(ids), "each event done exactly once in the workers' logs"
    assert sorted(r[0] for r in rows) == sorted(ids) and {r[1] for r in rows} == {"done"}
    by_id = {line["id"]: line["worker"] for line in lines if line["what"] == "done" and line not in casualties}
    assert all(by_id[r[0]] == r[2] for r in rows), "the worker that logged done is completed_by"
    assert len({line["worker"] for line in lines}) == 3, "the three workers shared the queue"
    # The victim's event: started by the victim, taken over only after its lease ended
    # (no earlier than the expired attempt's end), completed by another worker on attempt 2.
    attempts = conn.execute("""SELECT claimed_by, outcome, claimed_at, ended_at FROM throttle.attempt_history
                               WHERE event_id = %s ORDER BY claimed_at""", (hang_id,)).fetchall()
    assert [(a[0] == victim, a[1]) for a in attempts] == [(True, "expired"), (False, "completed")]
    assert attempts[1][2] >= attempts[0][3]
    takeover = [line for line in lines if line["id"] == hang_id and line["what"] == "start"][1]
    assert takeover["worker"] != victim and takeover["attempt"] == 2
    assert takeover["at"] - killed_at > 0
    # Nothing done by the victim after it was killed.
    assert not [line for line in lines if line["worker"] == victim and line["at"] > killed_at]


def test_sigterm_finishes_then_a_second_hands_back(conn, name, tmp_path):
    """install_signal_handlers: the first SIGTERM lets the job run on and
    claims nothing more; the second cancels it and hands the event back with
    retry_in 0 (pending, due now, its attempt counted); exit 0."""
    log = str(tmp_path / "log")
    proc = start(tmp_path, name, f"{name}-w", log)
    try:
        hang_id = pg_throttle.schedule(conn, name, "hang", payload={"hang": True})
        assert wait_until(lambda: read_log(log), 10)
        proc.send_signal(signal.SIGTERM)
        after_id = pg_throttle.schedule(conn, name, "after")
        time.sleep(0.6)                 # three polls: a worker still claiming would have claimed it
        assert proc.poll() is None, "the first SIGTERM waits for the job"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    rows = conn.execute("""SELECT id, state, attempts, last_error, run_at <= now() FROM throttle.event
                           WHERE queue = %s ORDER BY id""", (name,)).fetchall()
    assert rows == [(hang_id, "pending", 1, pg_throttle.Worker.HANDED_BACK, True),
                    (after_id, "pending", 0, None, True)]
    assert [line["what"] for line in read_log(log)] == ["start", "cancelled"]


def test_a_second_sigterm_frees_a_stuck_handler(conn, name, tmp_path):
    """A handler that ignores context.cancelled: the second SIGTERM hands its
    event back once abort_grace (0.5 s) has passed, and the worker exits 0
    without waiting for the handler; nothing completes the event."""
    log = str(tmp_path / "log")
    proc = start(tmp_path, name, f"{name}-w", log, abort_grace=0.5)
    try:
        stuck_id = pg_throttle.schedule(conn, name, "stuck", payload={"stuck": True})
        assert wait_until(lambda: read_log(log), 10)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert 0.4 <= took < 5, took
    row = conn.execute("SELECT state, attempts, last_error, run_at <= now() FROM throttle.event WHERE id = %s",
                       (stuck_id,)).fetchone()
    assert row == ("pending", 1, pg_throttle.Worker.HANDED_BACK, True)
    assert [line["what"] for line in read_log(log)] == ["start"]


def test_a_third_signal_exits_at_once(conn, name, tmp_path):
    """After the abort, a signal ends the process at once (its default
    action), not after abort_grace (30 s here): the event is left claimed, to
    be taken over when its lease ends."""
    log = str(tmp_path / "log")
    proc = start(tmp_path, name, f"{name}-w", log, abort_grace=30)
    try:
        stuck_id = pg_throttle.schedule(conn, name, "stuck", payload={"stuck": True})
        assert wait_until(lambda: read_log(log), 10)
        for _ in range(2):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
        assert proc.poll() is None, "the worker waits abort_grace for its handler"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == -signal.SIGTERM
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert took < 2, took
    assert conn.execute("SELECT state, attempts FROM throttle.event WHERE id = %s",
                        (stuck_id,)).fetchone() == ("claimed", 1)
