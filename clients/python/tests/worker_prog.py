#!/usr/bin/python3
"""A worker process for test_processes.py: worker_prog.py QUEUE NAME LOG LEASE.

Appends a JSON line to LOG when it starts an event and when it finished one;
an event whose payload has {"hang": true} hangs on its first attempt until
the worker aborts (the test kills the process, or sends a second SIGTERM).
SIGTERM: finish and exit 0; a second one: hand back and exit 0."""
import json
import os
import sys
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

    def handler(event, context):
        line = {"worker": name, "pid": os.getpid(), "id": event["id"], "attempt": event["attempts"]}
        append_line(log, {**line, "at": time.time(), "what": "start"})
        if event["payload"].get("hang") and event["attempts"] == 1:
            try:
                context.sleep(3600)
            except pg_throttle.Cancelled:
                append_line(log, {**line, "at": time.time(), "what": "cancelled"})
                raise
        time.sleep(0.01)
        append_line(log, {**line, "at": time.time(), "what": "done"})
    worker = pg_throttle.Worker(queue, handler, name=name, lease=lease, poll=0.2, max=2, concurrency=2,
                                install_signal_handlers=True, on_ready=lambda w: print("ready", flush=True))
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
