#!/usr/bin/python3
"""Runs the SQL examples of the user documentation, so that a wrong example
fails CI, and checks that the documentation's pages and links exist.

The documents are README.md, CONTRIBUTING.md and every docs/*.md. Each one's
```sql blocks run in psql, in the order of the page, in a database of the
page's own (made afresh for each page) that holds test/readme/fixtures.sql
(the application objects the examples assume) and pg_throttle: the runner
creates the extension unless the page's first block that runs does (as the
README's installation section does). A page is read on its own, so a page
whose examples need earlier setup repeats it in a block of its own. Each block
runs in a psql session of its own (psql variables set with \\gset last for
the block). The line before a block may say:

  <!-- not run: REASON -->      not run (signatures; refused if it holds a statement)
  <!-- example: output -->      the psql output shown after a statement, as
                                comment lines right below it ("-- UPDATE 1", a
                                result table), must be what psql prints
  <!-- example: busy NAME -->   run again while another session holds the lock
                                NAME: it must still run cleanly

Any other block must run without an error. Test titles name the file and the
line of the block's opening fence. Arguments, if any, name the documents
whose examples run (e.g. docs/queue.md, while writing it); the checks of pages
and links run whatever they are.

Before the examples: every page the documentation is made of exists, and every
relative link of these documents (and of CHANGELOG.md) points at a file or
folder that exists and, with a #fragment into a Markdown file, at one of its
headings.
"""
import glob
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
CREATES_EXTENSION = re.compile(r"CREATE\s+EXTENSION\s+(IF\s+NOT\s+EXISTS\s+)?pg_throttle\b", re.I)

# The pages the documentation is made of (README.md links them all).
PAGES = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/README.md",
         "docs/acquire.md", "docs/rate-limits.md", "docs/locks.md", "docs/queue.md",
         "docs/recurring.md", "docs/crashes-and-failover.md", "docs/security.md", "docs/operations.md",
         "docs/install.md", "docs/clients.md", "docs/dashboard.md", "docs/performance.md",
         "docs/reference.md", "docs/design.md"]
# The documents whose SQL blocks run, and whose links are checked.
EXAMPLE_DOCUMENTS = ["README.md", "CONTRIBUTING.md"]
LINKED_DOCUMENTS = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"]


def documents(names):
    """The given documents and every docs/*.md, in a fixed order."""
    found = list(names) + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return [d for d in found if os.path.exists(os.path.join(ROOT, d))]


class Block:
    def __init__(self, document, line, lines, kind, argument):
        self.document = document  # path from the repository's root
        self.line = line          # line of the opening fence
        self.lines = lines
        self.kind = kind          # None, "not run" or "example"
        self.argument = argument

    @property
    def title(self):
        first = next((l for l in self.lines if l.strip() and not l.startswith("--")), "")
        return f"{self.document} line {self.line}: {first.strip()[:60]}"


def blocks(document, text):
    found = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sql":
            previous = next((l for l in reversed(lines[:i]) if l.strip()), "")
            match = ANNOTATION.search(previous)
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            found.append(Block(document, i + 1, lines[i + 1:end], match and match.group(1),
                               match and match.group(2)))
            i = end
        i += 1
    return found


def slug(heading):
    """The anchor GitHub gives a heading."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text):
    found = set()
    seen = {}
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"^#{1,6} ", line):
            base = slug(line.lstrip("#"))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
    return found


def links(text):
    """(line, target) of every Markdown link outside code."""
    found = []
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        found.extend((n, target) for target in re.findall(r"\]\(([^)\s]+)\)", line))
    return found


def broken_links(document):
    with open(os.path.join(ROOT, document)) as f:
        text = f.read()
    broken = []
    for n, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(os.path.join(ROOT, document)), path)) \
            if path else os.path.join(ROOT, document)
        if not os.path.exists(resolved):
            broken.append(f"line {n}: {target}: no such file")
        elif fragment and resolved.endswith(".md"):
            with open(resolved) as f:
                if fragment not in anchors(f.read()):
                    broken.append(f"line {n}: {target}: no such heading")
    return broken


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
                   f"page shows", "have:\n" + "\n".join(have) + "\nwant:\n" + "\n".join(want))


def checks(block):
    if block.kind == "not run":
        return 1
    if block.kind == "example" and block.argument == "output":
        return 1 + sum(1 for _, shown in statements(block.lines) if shown)
    if block.kind == "example" and block.argument.startswith("busy "):
        return 2
    return 1


def creates_extension(found):
    """Whether the page's first block that runs creates pg_throttle itself."""
    first = next((b for b in found if b.kind != "not run"), None)
    return first is not None and any(CREATES_EXTENSION.search(without_comment(l)) for l in first.lines)


def fresh_database(admin, found):
    admin.cursor().execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    admin.cursor().execute(f"CREATE DATABASE {DATABASE}")
    setup = open(os.path.join(ROOT, "test", "readme", "fixtures.sql")).read()
    if not creates_extension(found):
        setup += "\nCREATE EXTENSION pg_throttle;\n"
    done = psql(setup)
    if done.returncode != 0:
        sys.exit("the examples' database could not be set up: " + done.stderr)


def run_block(tap, block):
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


def main():
    # Arguments name documents to run alone (while writing them); none: all.
    examples = sys.argv[1:] or documents(EXAMPLE_DOCUMENTS)
    linked = documents(LINKED_DOCUMENTS)
    found = {}
    for document in examples:
        with open(os.path.join(ROOT, document)) as f:
            found[document] = blocks(document, f.read())
    total = sum(len(b) for b in found.values())
    tap = Tap(2 + len(PAGES) + len(linked) + sum(checks(b) for bs in found.values() for b in bs))
    tap.ok(total >= 35, f"the documentation has SQL examples ({total} blocks in {len(examples)} files)")
    tap.ok(len(found.get("README.md", [])) >= 4, "the README has SQL examples "
           f"({len(found.get('README.md', []))} blocks)")
    for page in PAGES:
        tap.ok(os.path.exists(os.path.join(ROOT, page)), f"{page} exists")
    for document in linked:
        broken = broken_links(document)
        tap.ok(not broken, f"{document}: every relative link points at a file and heading that exist",
               "\n".join(broken))

    admin = connect()
    for document in examples:
        if not found[document]:
            continue
        fresh_database(admin, found[document])
        for block in found[document]:
            run_block(tap, block)

    admin.cursor().execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    admin.close()
    tap.done()


if __name__ == "__main__":
    main()
