"""Waiting for a condition with a deadline, instead of sleeping a guessed time."""
import time


def wait_until(condition, timeout=5.0, step=0.02):
    """Calls `condition` every `step` seconds until it returns something true or
    `timeout` seconds pass; returns its last answer (false on a timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = condition()
        if answer or time.monotonic() >= deadline:
            return answer
        time.sleep(step)
