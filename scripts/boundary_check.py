#!/usr/bin/python3
"""Checks the C++ / PostgreSQL boundary rules of docs/design.md ("The boundary")
on the sources, mechanically (make boundary-check). Each violation is printed as
FILE:LINE: RULE: what is wrong; the exit code is 1 when there is any.

Rules:
  core-pure      src/core includes neither PostgreSQL headers nor src/pg headers.
  layers         project headers are named from src/ (never through ".."); includes point down: server < registry < durability < scale_out
                 < acquire, rate, locks < queue < src/pg/*.cpp; no primitive
                 (acquire, rate, locks) includes another.
  sql-entry      every SQL-callable function is declared by PG_THROTTLE_SQL_FUNCTION
                 (server/boundary.hpp: its body runs through call_guarded), in a file
                 named *_sql.cpp; PG_FUNCTION_INFO_V1 and PG_FUNCTION_ARGS appear nowhere
                 else; every C symbol the install and upgrade scripts name is one.
  no-throw       no C++ `throw`; try / catch only in server/boundary.cpp.
  lock-raise     nothing that raises or sleeps (ereport, elog, CHECK_FOR_INTERRUPTS,
                 palloc and its kin, SPI) between an LWLock acquire (plain, conditional,
                 or-wait; arguments on one line or two) and its release at the same
                 block depth (a release in an early-return branch ends the hold in that
                 branch only), between SpinLockAcquire and SpinLockRelease, in the
                 scope of a PartitionLock (registry.cpp) or between lock_all_partitions
                 and unlock_all_partitions. Functions called under a lock are not
                 followed: what they call is for review (docs/design.md).
  shmem-plain    every type placed in shared memory by ShmemInitStruct (the type its
                 result is cast to) or ShmemInitHash (its keysize and entrysize) has a
                 static_assert(std::is_trivially_copyable_v<T>).

Python 3 standard library only. Run from the repository's root, or pass it.
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.getcwd()
SRC = os.path.join(ROOT, "src")

# Layers of src/pg, lowest first: a file may include its own layer and those below.
LAYERS = {"server": 1, "registry": 2, "durability": 3, "scale_out": 4,
          "acquire": 5, "rate": 5, "locks": 5, "queue": 6}
TOP = 7  # src/pg/*.cpp: module.cpp and the entries that span every kind
PRIMITIVES = {"acquire", "rate", "locks"}

problems = []


def report(path, line, rule, message):
    problems.append(f"{os.path.relpath(path, ROOT)}:{line}: {rule}: {message}")


def sources():
    for dirpath, _, names in os.walk(SRC):
        for name in sorted(names):
            if name.endswith((".cpp", ".hpp")):
                yield os.path.join(dirpath, name)


def strip_comments(text):
    """The text with comments and string literals blanked, line numbers kept."""
    def blank(match):
        return re.sub(r"[^\n]", " ", match.group(0))
    pattern = r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])\''
    return re.sub(pattern, blank, text, flags=re.S)


def layer_of(rel):
    """(layer rank, folder) of a path relative to src, or None outside src/pg."""
    parts = rel.split("/")
    if parts[0] == "core":
        return 0, "core"
    if parts[0] != "pg":
        return None
    if len(parts) == 2:
        return TOP, ""
    return LAYERS.get(parts[1], TOP), parts[1]


def check_includes(path, raw):
    rel = os.path.relpath(path, SRC)
    mine = layer_of(rel)
    for number, line in enumerate(raw.split("\n"), 1):
        m = re.match(r'\s*#\s*include\s*([<"])([^>"]+)[>"]', line)
        if not m:
            continue
        quoted, target = m.group(1) == '"', m.group(2)
        if quoted and ".." in target.split("/"):
            report(path, number, "layers", f"includes \"{target}\": project headers are named "
                   "from src/ (\"pg/...\", \"core/...\"), never through \"..\"")
            continue
        if mine[1] == "core":
            if quoted and not target.startswith("core/"):
                report(path, number, "core-pure", f"src/core includes \"{target}\": the pure core "
                       "includes only core/ headers and the C++ standard library")
            elif not quoted and (target.endswith(".h") or "/" in target):
                report(path, number, "core-pure", f"src/core includes <{target}>: the pure core "
                       "includes no PostgreSQL (or other C) header")
            continue
        if not quoted or not target.startswith("pg/"):
            continue
        theirs = layer_of(target)
        if theirs is None:
            continue
        if theirs[0] > mine[0]:
            report(path, number, "layers", f"includes \"{target}\", a layer above its own "
                   f"(src/pg/{mine[1] or '*.cpp'} may include only what lies beneath it: "
                   "server < registry < durability < scale_out < acquire, rate, locks < queue)")
        elif (mine[1] in PRIMITIVES and theirs[1] in PRIMITIVES and mine[1] != theirs[1]):
            report(path, number, "layers", f"includes \"{target}\": primitives "
                   "(acquire, rate, locks) do not include each other")


def check_entries(path, code):
    rel = os.path.relpath(path, SRC)
    boundary = rel == "pg/server/boundary.hpp"
    is_sql = rel.endswith("_sql.cpp")
    entries = 0
    for number, line in enumerate(code.split("\n"), 1):
        if not boundary and re.search(r"\bPG_FUNCTION_INFO_V1\b|\bPG_FUNCTION_ARGS\b|\bpg_finfo_",
                                      line):
            report(path, number, "sql-entry", "a SQL function declared by hand: use "
                   "PG_THROTTLE_SQL_FUNCTION (server/boundary.hpp), whose body runs call_guarded")
        m = re.search(r"\bPG_THROTTLE_SQL_FUNCTION\s*\(", line)
        if m and not boundary:
            entries += 1
            if not is_sql:
                report(path, number, "sql-entry", "a SQL entry point outside a *_sql.cpp file")
    if is_sql and entries == 0:
        report(path, 1, "sql-entry", "a *_sql.cpp file with no PG_THROTTLE_SQL_FUNCTION")


def check_symbols(declared):
    sql_dir = os.path.join(SRC, "sql")
    for dirpath, _, names in os.walk(sql_dir):
        for name in sorted(names):
            if not name.endswith(".sql"):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            # AS 'MODULE_PATHNAME', 'symbol' (or the library named), across lines.
            pattern = r"'(?:MODULE_PATHNAME|\$libdir/pg_throttle(?:\.so)?|pg_throttle)'\s*,\s*'(\w+)'"
            for m in re.finditer(pattern, text):
                if m.group(1) not in declared:
                    report(path, text.count("\n", 0, m.start()) + 1, "sql-entry",
                           f"C symbol {m.group(1)} is not declared by PG_THROTTLE_SQL_FUNCTION "
                           "in any *_sql.cpp")


def check_throw(path, code):
    rel = os.path.relpath(path, SRC)
    for number, line in enumerate(code.split("\n"), 1):
        if re.search(r"\bthrow\b", line):
            report(path, number, "no-throw", "a C++ throw: raise errors with ereport")
        if rel != "pg/server/boundary.cpp" and re.search(r"\btry\s*\{|\bcatch\s*\(", line):
            report(path, number, "no-throw", "try / catch outside server/boundary.cpp "
                   "(call_guarded is the one place exceptions are caught)")


# What raises or may sleep: ereport / elog, an interrupt check, memory allocation
# (palloc raises when out of memory), SPI.
RAISE = re.compile(r"\b(ereport|elog|CHECK_FOR_INTERRUPTS|palloc\w*|repalloc\w*|pstrdup|psprintf|"
                   r"SPI_\w+)\s*\(")


def check_lock_raise(path, code):
    lines = code.split("\n")
    # Explicit pairs: from an acquire to the next release of the same lock.
    pairs = [(r"\bLWLock(?:Conditional)?Acquire(?:OrWait)?\s*\(\s*([^,]+),",
              r"\bLWLockRelease\s*\(\s*{}\s*\)", "LWLock"),
             (r"\bSpinLockAcquire\s*\(\s*([^)]+)\)", r"\bSpinLockRelease\s*\(\s*{}\s*\)", "spinlock"),
             (r"\block_all_partitions\s*\(()", r"\bunlock_all_partitions\s*\(", "partition locks")]
    for acquire, release, what in pairs:
        for i, line in enumerate(lines):
            # An acquire whose arguments continue on the next line counts too.
            m = re.search(acquire, line + " " + (lines[i + 1] if i + 1 < len(lines) else ""))
            if not m or m.start() >= len(line) or re.match(r"\s*(void|inline)\b", line):
                continue
            if "PartitionLock(" in line:
                continue  # the class itself (see below)
            end_re = re.compile(release.format(re.escape(m.group(1).strip())))
            # Held until a release at the acquire's own block depth, or the end of
            # that block. A release in a nested branch (an early return) ends the
            # hold on that branch only: the lines after the branch still hold it.
            depth = line[m.start():].count("{") - line[m.start():].count("}")
            for j in range(i + 1, min(len(lines), i + 400)):
                end = end_re.search(lines[j])
                if end and depth + lines[j][:end.start()].count("{") \
                        - lines[j][:end.start()].count("}") == 0:
                    break
                if RAISE.search(lines[j]) and not end_re.search(lines[j]):
                    report(path, j + 1, "lock-raise", f"{RAISE.search(lines[j]).group(1)} "
                           f"(raises or sleeps) while holding a {what} (taken at line {i + 1}): "
                           "copy what is needed, release, then raise")
                depth += lines[j].count("{") - lines[j].count("}")
                if depth < 0:
                    break
    # Scoped locks: from the PartitionLock to the end of its block or its release().
    for i, line in enumerate(lines):
        m = re.search(r"\bPartitionLock\s+(\w+)\s*\(", line)
        if not m:
            continue
        depth = 0
        for j in range(i, len(lines)):
            text = lines[j] if j > i else line[m.end():]
            if j > i and re.search(rf"\b{m.group(1)}\s*\.\s*release\s*\(", text):
                break
            if j > i and RAISE.search(text):
                report(path, j + 1, "lock-raise", f"{RAISE.search(text).group(1)} (raises or "
                       "sleeps) in the scope of PartitionLock "
                       f"{m.group(1)} (line {i + 1}): raise after its scope")
            depth += text.count("{") - text.count("}")
            if depth < 0:
                break


PLAIN_TYPES = {"char", "void", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32",
               "int64", "Size", "LWLock", "LWLockPadded", "pg_atomic_uint32", "pg_atomic_uint64"}


def function_around(lines, i):
    start = i
    while start > 0 and not re.match(r"[A-Za-z].*\{\s*$", lines[start]):
        start -= 1
    end = i
    while end < len(lines) - 1 and not re.match(r"}\s*$", lines[end]):
        end += 1
    return start, end


def check_shmem(path, code, asserted):
    lines = code.split("\n")
    for i, line in enumerate(lines):
        m = re.search(r"\b(ShmemInitStruct|ShmemInitHash)\s*\(", line)
        if not m:
            continue
        start, end = function_around(lines, i)
        body = "\n".join(lines[start:end + 1])
        if m.group(1) == "ShmemInitStruct":
            types = re.findall(r"(?:static|reinterpret)_cast<\s*([\w:]+)\s*\*\s*>", body)
        else:
            types = re.findall(r"\b(?:keysize|entrysize)\s*=\s*sizeof\(\s*([\w:]+)\s*\)", body)
        for t in sorted(set(types) - PLAIN_TYPES):
            if t.split("::")[-1] not in asserted:
                report(path, i + 1, "shmem-plain", f"{t} is placed in shared memory by "
                       f"{m.group(1)} without static_assert(std::is_trivially_copyable_v<{t}>)")


def main():
    texts = {}
    for path in sources():
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        texts[path] = (raw, strip_comments(raw))
    asserted = set()
    declared = set()
    for raw, code in texts.values():
        asserted.update(t.split("::")[-1] for t in
                        re.findall(r"static_assert\(\s*std::is_trivially_copyable_v<\s*([\w:]+)\s*>",
                                   code))
    for path, (raw, code) in texts.items():
        check_includes(path, code_with_includes(raw, code))
        check_entries(path, code)
        check_throw(path, code)
        check_lock_raise(path, code)
        check_shmem(path, code, asserted)
        if os.path.relpath(path, SRC).endswith("_sql.cpp"):
            declared.update(re.findall(r"PG_THROTTLE_SQL_FUNCTION\(\s*(\w+)", code))
    check_symbols(declared)
    for problem in problems:
        print(problem)
    if problems:
        print(f"boundary-check: {len(problems)} violation(s) of the boundary rules "
              "(docs/design.md, \"The boundary\")", file=sys.stderr)
        return 1
    print(f"boundary-check: {len(texts)} files keep the boundary rules")
    return 0


def code_with_includes(raw, code):
    """The code with comments stripped but #include targets (blanked as strings) restored."""
    out = []
    for raw_line, code_line in zip(raw.split("\n"), code.split("\n")):
        out.append(raw_line if re.match(r"\s*#\s*include", raw_line) else code_line)
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
