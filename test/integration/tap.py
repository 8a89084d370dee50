"""A minimal TAP producer for the integration tests (run by prove)."""
import sys


class Tap:
    def __init__(self, planned):
        self.planned = planned
        self.count = 0
        self.failed = 0
        print(f"1..{planned}", flush=True)

    def ok(self, condition, name, diagnostics=""):
        self.count += 1
        if not condition:
            self.failed += 1
        print(f"{'ok' if condition else 'not ok'} {self.count} - {name}", flush=True)
        if not condition and diagnostics:
            for line in str(diagnostics).splitlines():
                print(f"# {line}", flush=True)

    def is_(self, have, want, name):
        self.ok(have == want, name, f"have: {have!r}\nwant: {want!r}")

    def done(self):
        if self.count != self.planned:
            print(f"# planned {self.planned} tests but ran {self.count}", flush=True)
        sys.exit(1 if self.failed or self.count != self.planned else 0)
