#!/usr/bin/python3
"""A worker process for test_processes.py:
worker_prog.py QUEUE NAME LOG LEASE [GATE [ABORT_GRACE]].

Appends a JSON line to LOG when it starts an event and when it finished one;
an event whose payload has {"hang": true} hangs on its first attempt until
the worker aborts (the test kills the process, or sends a second SIGTERM);
one with {"stuck": true} hangs for an hour whatever happens, ignoring
context.cancelled. SIGTERM: finish and exit 0; a second one: hand back and
exit 0 (a stuck handler's events after ABORT_GRACE seconds, default 2); a
third: die of it at once."""
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
import pg_throttle  # noqa: E402


def append_line(path, record):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def main():
    queue, name, log, lease = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    # GATE (optional): the first events wait until GATE workers have started
    # one, so that every worker of the test gets work whatever the timing.
    gate = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    abort_grace = float(sys.argv[6]) if len(sys.argv) > 6 else 2
    gate_open = threading.Event()

    def wait_for_gate():
        end = time.monotonic() + 15
        while not gate_open.is_set() and time.monotonic() < end:
            with open(log) as f:
                started = {json.loads(line)["worker"] for line in f if '"start"' in line}
            if len(started) >= gate:
                gate_open.set()
            else:
                time.sleep(0.01)

    def handler(event, context):
        line = {"worker": name, "pid": os.getpid(), "id": event["id"], "attempt": event["attempts"]}
        append_line(log, {**line, "at": time.time(), "what": "start"})
        if gate:
            wait_for_gate()
        if event["payload"].get("stuck"):
            time.sleep(3600)                # a call that never looks at context.cancelled
        if event["payload"].get("hang") and event["attempts"] == 1:
            try:
                context.sleep(3600)
            except pg_throttle.Cancelled:
                append_line(log, {**line, "at": time.time(), "what": "cancelled"})
                raise
        time.sleep(0.01)
        append_line(log, {**line, "at": time.time(), "what": "done"})
    worker = pg_throttle.Worker(queue, handler, name=name, lease=lease, poll=0.2, max=2, concurrency=2,
                                install_signal_handlers=True, on_ready=lambda w: print("ready", flush=True),
                                abort_grace=abort_grace)
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
