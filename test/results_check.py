#!/usr/bin/python3
"""test/results.sh, which every suite of the test command runs through, counts
what a suite's own output says: passes, failures, and a suite that skipped
itself (TAP's "1..0 # SKIP REASON") shown as skipped with its reason, never as
"0 passed, 0 failed". Runs fake suites through run_suite in bash. Prints TAP.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "integration"))
from tap import Tap  # noqa: E402

RESULTS_SH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.sh")


def run(suites):
    """Runs each (name, TAP output, exit code) through run_suite with prove;
    returns (the results file, the summary, what run_suite printed, exit codes)."""
    with tempfile.TemporaryDirectory() as tmp:
        script = ["set -u", f"source {RESULTS_SH}", "codes=()"]
        for i, (name, output, code) in enumerate(suites):
            fake = os.path.join(tmp, f"{name}.py")
            with open(fake, "w") as f:
                f.write(f"#!/usr/bin/python3\nimport sys\nprint({output!r})\nsys.exit({code})\n")
            os.chmod(fake, 0o755)
            script.append(f"run_suite {name} prove prove --verbose {fake}; codes+=($?)")
        results = os.path.join(tmp, "results")
        script += ['echo "codes ${codes[*]}"', f"summarize_results {results} >{tmp}/summary"]
        done = subprocess.run(["bash", "-c", "\n".join(script)], capture_output=True, text=True,
                              env=dict(os.environ, PG_THROTTLE_RESULTS=results))
        with open(results) as f:
            recorded = f.read().splitlines()
        with open(os.path.join(tmp, "summary")) as f:
            summary = f.read()
    codes = next(l for l in done.stdout.splitlines() if l.startswith("codes ")).split()[1:]
    return recorded, summary, done.stdout, [int(c) for c in codes]


def run_formatted(suites):
    """Runs each (name, format, output, exit code) through run_suite; returns the
    results file's lines."""
    with tempfile.TemporaryDirectory() as tmp:
        script = ["set -u", f"source {RESULTS_SH}"]
        for name, fmt, output, code in suites:
            shown = os.path.join(tmp, f"{name}.out")
            with open(shown, "w") as f:
                f.write(output)
            script.append(f"run_suite {name} {fmt} bash -c 'cat {shown}; exit {code}'")
        results = os.path.join(tmp, "results")
        subprocess.run(["bash", "-c", "\n".join(script)], capture_output=True, text=True,
                       env=dict(os.environ, PG_THROTTLE_RESULTS=results))
        with open(results) as f:
            return f.read().splitlines()


def check_runners(tap):
    """Node's test runner and pytest, as the client packages' suites print them."""
    recorded = run_formatted([
        ("node_passes", "node", "\u2139 tests 3\n\u2139 pass 3\n\u2139 fail 0\n\u2139 cancelled 0\n", 0),
        ("node_fails", "node", "\u2139 tests 4\n\u2139 pass 2\n\u2139 fail 1\n\u2139 cancelled 1\n", 1),
        ("node_none", "node", "\u2139 tests 0\n\u2139 pass 0\n\u2139 fail 0\n", 0),
        ("py_passes", "pytest", "....\n4 passed in 1.20s\n", 0),
        ("py_fails", "pytest", "..FE\n1 failed, 2 passed, 1 error in 1.20s\n", 1),
        ("py_skips", "pytest", "7 passed, 1 skipped in 2.00s\n", 0),
        ("py_none", "pytest", "no tests ran in 0.01s\n", 5),
    ])
    tap.is_(recorded, ["node_passes 3 0", "node_fails 2 2", "node_none 0 1", "py_passes 4 0",
                       "py_fails 2 2", "py_skips 7 0", "py_none 0 1"],
            "node --test and pytest summaries: a cancelled test and an error are failures,"
            " a run of no test is one")


def main():
    tap = Tap(10)
    check_runners(tap)
    recorded, summary, out, codes = run([
        ("passes", "1..2\nok 1\nok 2", 0),
        ("fails", "1..2\nok 1\nnot ok 2", 1),
        ("skips", "1..0 # SKIP Citus is not installed for this server (no citus.so)", 0),
        ("skips_and_fails", "1..0 # SKIP a reason", 3),
    ])
    tap.ok(recorded[0] == "passes 2 0", f"a passing suite is recorded as such ({recorded[0]!r})")
    tap.ok(recorded[1] == "fails 1 1", f"a failing test counts ({recorded[1]!r})")
    tap.ok(recorded[2] == "skips 0 0 SKIP Citus is not installed for this server (no citus.so)",
              f"a suite that skipped itself is recorded with its reason ({recorded[2]!r})")
    tap.ok(recorded[3].startswith("skips_and_fails 0 1") and "SKIP" not in recorded[3],
              f"a skip that exits non-zero is a failure ({recorded[3]!r})")
    tap.ok(codes == [0, 1, 0, 1], f"run_suite's exit codes: 0, 1, 0, 1 ({codes})")
    tap.ok("---- skips: skipped (Citus is not installed for this server (no citus.so))" in out,
              "run_suite says skipped, with the reason")
    tap.ok("---- skips: 0 passed, 0 failed" not in out, "never '0 passed, 0 failed' for it")
    tap.ok("skipped: Citus is not installed for this server (no citus.so)" in summary
              and "skips                             0 passed" not in summary,
              "the summary shows the skipped suite with its reason")
    tap.ok("passes                            2 passed, 0 failed" in summary,
              f"the summary counts the others:\n{summary}")
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
