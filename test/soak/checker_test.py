#!/usr/bin/python3
"""The soak checker finds the violations it exists for, and reports none
where the timing leaves room for a correct server: logs with planted
violations, and their correct counterparts."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import checker  # noqa: E402
from tap import Tap  # noqa: E402


def grant(name, s, e, token=None):
    return {"name": name, "s": s, "e": e, "token": token}


def main():
    tap = Tap(14)
    # Resources, every 2 s.
    tap.ok(checker.resource_violations([grant("r", 0.0, 0.1), grant("r", 1.0, 1.1)], 2.0),
           "two grants 1 s apart: a violation")
    tap.ok(not checker.resource_violations([grant("r", 0.0, 0.1), grant("r", 2.05, 2.2)], 2.0),
           "2 s apart: none")
    tap.ok(not checker.resource_violations([grant("r", 0.0, 1.0), grant("r", 1.5, 2.5)], 2.0),
           "decision times that may be 2 s apart (slow answers): none")
    tap.ok(not checker.resource_violations([grant("r", 0.0, 0.1), grant("q", 0.5, 0.6)], 2.0),
           "two names: none")
    # A bucket of burst 5, one unit per 0.05 s.
    burst = [grant(None, 0.001 * i, 0.001 * i + 0.0005) for i in range(5)]
    tap.ok(not checker.bucket_violations(burst, 5, 0.05), "a burst of 5 at once: none")
    tap.ok(checker.bucket_violations(burst + [grant(None, 0.006, 0.0065)], 5, 0.05),
           "a sixth unit 6 ms later: a violation")
    tap.ok(not checker.bucket_violations(burst + [grant(None, 0.06, 0.061)], 5, 0.05),
           "a sixth unit one emission interval later: none")
    # Leases, ttl 2 s.
    a = {"name": "l", "token": 1, "s": 0.0, "e": 0.1, "renews": [], "released": None}
    b = {"name": "l", "token": 2, "s": 1.0, "e": 1.1, "renews": [], "released": None}
    tap.ok(checker.overlap_violations(checker.holding_intervals([a, b], 2.0), "lease"),
           "a second holder while the first's lease runs: a violation")
    a_released = dict(a, released=0.9)
    tap.ok(not checker.overlap_violations(checker.holding_intervals([a_released, b], 2.0), "lease"),
           "after the first released it: none")
    c = {"name": "l", "token": 2, "s": 2.1, "e": 2.2, "renews": [], "released": None}
    tap.ok(not checker.overlap_violations(checker.holding_intervals([a, c], 2.0), "lease"),
           "after the first's lease ran out: none")
    a_renewed = dict(a, renews=[(1.5, 1.6, True)])
    tap.ok(checker.overlap_violations(checker.holding_intervals([a_renewed, c], 2.0), "lease"),
           "while a renewed lease runs: a violation")
    # Tokens.
    tap.ok(checker.token_violations([grant("l", 0.0, 0.1, 5), grant("l", 0.2, 0.3, 4)], "lease"),
           "a smaller token granted later: a violation")
    tap.ok(not checker.token_violations([grant("l", 0.0, 0.3, 5), grant("l", 0.2, 0.4, 4)], "lease"),
           "calls that overlap in time may be answered in either order: none")
    # Events.
    tap.is_(len(checker.event_violations({"e1", "e2", "e3"}, {"e1": ["done"], "e2": ["pending"]})), 2,
            "one event never done and one lost: two violations")
    tap.done()


if __name__ == "__main__":
    main()
