#!/usr/bin/python3
"""Runs the README's SQL examples, so that a wrong example fails CI.

Every ```sql block of README.md runs in psql, in the order of the README, in a
database of its own that holds test/readme/fixtures.sql (the application
objects the examples assume); the README's own CREATE EXTENSION installs
pg_throttle there. The line before a block may say:

  <!-- not run: REASON -->      not run (signatures; refused if it holds a statement)
  <!-- example: output -->      the psql output shown after a statement, as
                                comment lines right below it ("-- UPDATE 1", a
                                result table), must be what psql prints
  <!-- example: busy NAME -->   run again while another session holds the lock
                                NAME: it must still run cleanly

Any other block must run without an error.
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one  # noqa: E402
from tap import Tap  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATABASE = "readme_examples"
ANNOTATION = re.compile(r"<!--\s*(not run|example):\s*(.*?)\s*-->")
MARKER = "@@readme-statement "
STATEMENT_WORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DO)\b")


class Block:
    def __init__(self, line, lines, kind, argument):
        self.line = line          # README line of the opening fence
        self.lines = lines
        self.kind = kind          # None, "not run" or "example"
        self.argument = argument

    @property
    def title(self):
        first = next((l for l in self.lines if l.strip() and not l.startswith("--")), "")
        return f"README line {self.line}: {first.strip()[:60]}"


def blocks(readme):
    found = []
    lines = readme.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sql":
            previous = next((l for l in reversed(lines[:i]) if l.strip()), "")
            match = ANNOTATION.search(previous)
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            found.append(Block(i + 1, lines[i + 1:end], match and match.group(1),
                               match and match.group(2)))
            i = end
        i += 1
    return found


def without_comment(line):
    return re.sub(r"\s*--.*$", "", line).rstrip()


def statements(lines):
    """Splits a block into statements: (its lines, the output shown below it)."""
    result = []
    current = []
    dollars = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not current and (not line.strip() or line.lstrip().startswith("--")):
            continue
        current.append(line)
        dollars += line.count("$$")
        code = without_comment(line)
        ends = (code.endswith(";") and dollars % 2 == 0) or "\\gset" in code or \
            code.lstrip().startswith("\\")
        if ends:
            shown = []
            while i < len(lines) and lines[i].startswith("--"):
                shown.append(lines[i][3:] if lines[i].startswith("-- ") else lines[i][2:])
                i += 1
            result.append((current, shown))
            current = []
    if current:
        result.append((current, []))
    return result


def psql(script):
    env = dict(os.environ, PGOPTIONS="-c TimeZone=UTC -c DateStyle=ISO -c IntervalStyle=postgres")
    return subprocess.run(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-P", "footer=off", "-d", DATABASE, "-f", "-"],
        input=script, capture_output=True, text=True, env=env)


def ran_cleanly(done):
    return done.returncode == 0 and "ERROR" not in done.stderr


def run_plain(tap, block):
    done = psql("\n".join(block.lines) + "\n")
    tap.ok(ran_cleanly(done), f"{block.title}: runs", done.stderr)
    return done


def run_with_output(tap, block):
    parts = statements(block.lines)
    script = []
    for n, (lines, _) in enumerate(parts):
        script.append(f"\\echo '{MARKER}{n}'")
        script.extend(lines)
    done = psql("\n".join(script) + "\n")
    tap.ok(ran_cleanly(done), f"{block.title}: runs", done.stderr)
    printed = {}
    current = None
    for line in done.stdout.splitlines():
        if line.startswith(MARKER):
            current = int(line[len(MARKER):])
            printed[current] = []
        elif current is not None and line.strip():
            printed[current].append(line.rstrip())
    for n, (lines, shown) in enumerate(parts):
        if shown:
            want = [l.rstrip() for l in shown]
            have = printed.get(n, [])
            tap.ok(have == want, f"{block.title}: `{lines[0].strip()[:50]}` prints what the "
                   f"README shows", "have:\n" + "\n".join(have) + "\nwant:\n" + "\n".join(want))


def checks(block):
    if block.kind == "not run":
        return 1
    if block.kind == "example" and block.argument == "output":
        return 1 + sum(1 for _, shown in statements(block.lines) if shown)
    if block.kind == "example" and block.argument.startswith("busy "):
        return 2
    return 1


def main():
    with open(os.path.join(ROOT, "README.md")) as f:
        found = blocks(f.read())
    tap = Tap(1 + sum(checks(b) for b in found))
    tap.ok(len(found) >= 20, f"the README has SQL examples ({len(found)} blocks)")

    admin = connect()
    admin.cursor().execute(f"DROP DATABASE IF EXISTS {DATABASE}")
    admin.cursor().execute(f"CREATE DATABASE {DATABASE}")
    # No CREATE EXTENSION here: the README's installation section has it.
    setup = psql(open(os.path.join(ROOT, "test", "readme", "fixtures.sql")).read())
    if setup.returncode != 0:
        sys.exit("the examples' database could not be set up: " + setup.stderr)

    for block in found:
        if block.kind == "not run":
            runnable = [l for l in block.lines if STATEMENT_WORDS.search(without_comment(l))]
            tap.ok(not runnable, f"{block.title}: not run ({block.argument}), and holds no "
                   "statement", "\n".join(runnable))
        elif block.kind == "example" and block.argument == "output":
            run_with_output(tap, block)
        elif block.kind == "example" and block.argument.startswith("busy "):
            run_plain(tap, block)
            name = block.argument[len("busy "):]
            holder = connect(dbname=DATABASE)
            token = one(holder, "SELECT throttle.lock(%s)", (name,))[0]
            done = psql("\n".join(block.lines) + "\n")
            tap.ok(token is not None and ran_cleanly(done) and "busy" in done.stdout,
                   f"{block.title}: runs cleanly while another session holds {name!r}",
                   done.stdout + done.stderr)
            holder.close()
        else:
            run_plain(tap, block)

    admin.cursor().execute(f"DROP DATABASE {DATABASE} WITH (FORCE)")
    admin.close()
    tap.done()


if __name__ == "__main__":
    main()
