#!/usr/bin/python3
"""`make dist` builds the PGXN zip a user can install.

The zip is built into a temporary DIST_DIR and checked the way PGXN and its
users see it: one top directory pg_throttle-VERSION/ holding exactly the files
committed at HEAD (less what .gitattributes marks export-ignore), a META.json
that pgxnclient reads and that names the release's version and files, and a
tree that builds and installs twice, once through `pgxn install ./zip` and once
by hand (unzip, make, make install). Both installs go into a staging DESTDIR;
the system's installed extension is compared before and after to show it was
not touched. test/check_meta.py checks the work tree's META.json against the
spec; this checks the artefact. Needs git, make, the PostgreSQL server headers
(PG_CONFIG, default PostgreSQL 15) and Debian's pgxnclient. Prints TAP for prove.
"""
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "integration"))
from tap import Tap  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
EXTENSION = "pg_throttle"
PG_CONFIG = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
UPGRADE = re.compile(rf"^src/sql/upgrade/({EXTENSION}--([^-]+)--([^-]+)\.sql)$")
# Install scripts of released versions, shipped as released so that their
# dumps restore into them (docs/install.md, Upgrading).
RELEASED = re.compile(rf"^src/sql/releases/({EXTENSION}--[^-]+\.sql)$")


def git(*args, **kwargs):
    return subprocess.run(["git", "-C", ROOT, *args], check=True, capture_output=True, **kwargs).stdout


def default_version(control_text):
    match = re.search(r"^default_version = '([^']*)'", control_text, re.M)
    return match.group(1) if match else None


def export_ignored(files, scratch):
    """The committed files that git archive leaves out. Attributes are read from
    HEAD's .gitattributes (a scratch index holding HEAD, so neither the work tree
    nor the real index counts), and, as in git archive, a file is left out when
    it or any folder above it is marked."""
    paths = set(files)
    for f in files:
        paths.update(folders_above(f))
    env = dict(os.environ, GIT_INDEX_FILE=os.path.join(scratch, "index"))
    subprocess.run(["git", "-C", ROOT, "read-tree", "HEAD"], env=env, check=True)
    out = subprocess.run(["git", "-C", ROOT, "check-attr", "--cached", "-z", "--stdin", "export-ignore"],
                         input="\0".join(sorted(paths)).encode(), env=env, check=True,
                         capture_output=True).stdout.decode().split("\0")
    marked = {out[i] for i in range(0, len(out) - 2, 3) if out[i + 2] == "set"}
    return {f for f in files if marked.intersection([f, *folders_above(f)])}


def folders_above(path):
    """bench/queue/a.sql -> bench, bench/queue"""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def head_blobs(files):
    """HEAD's bytes of each file, through one git cat-file --batch."""
    proc = subprocess.run(["git", "-C", ROOT, "cat-file", "--batch"], check=True, capture_output=True,
                          input="".join(f"HEAD:{f}\n" for f in files).encode())
    out, pos, blobs = proc.stdout, 0, {}
    for f in files:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split()[2])
        blobs[f] = out[header_end + 1:header_end + 1 + size]
        pos = header_end + 1 + size + 1
    return blobs


def system_install():
    """Names and hashes of the extension's files in the system's PostgreSQL."""
    pkglib = pg_config("--pkglibdir")
    ext_dir = os.path.join(pg_config("--sharedir"), "extension")
    files = glob.glob(os.path.join(pkglib, f"{EXTENSION}.so")) + glob.glob(os.path.join(ext_dir, f"{EXTENSION}*"))
    return {f: hashlib.sha256(open(f, "rb").read()).hexdigest() for f in sorted(files)}


def pg_config(flag):
    return subprocess.run([PG_CONFIG, flag], check=True, capture_output=True, text=True).stdout.strip()


def run(cmd, cwd, env=None):
    """Runs a build step; returns (ok, the tail of its output for a diagnostic)."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc.returncode == 0, f"$ {' '.join(cmd)} (exit {proc.returncode})\n" + "\n".join(
        proc.stdout.splitlines()[-15:])


def check_stage(tap, how, stage, version, upgrades, release):
    """The staged tree holds the module, the control file, the install script of
    `version`, every upgrade script of the release and the released versions'
    install scripts it ships, and nothing else."""
    released = {m.group(1): release[m.group(0)] for m in map(RELEASED.match, release) if m}
    pkglib = stage + pg_config("--pkglibdir")
    ext_dir = stage + os.path.join(pg_config("--sharedir"), "extension")
    want = {os.path.join(pkglib, f"{EXTENSION}.so"), os.path.join(ext_dir, f"{EXTENSION}.control"),
            os.path.join(ext_dir, f"{EXTENSION}--{version}.sql")}
    want.update(os.path.join(ext_dir, name) for name in list(upgrades) + list(released))
    have = {os.path.join(d, f) for d, _, fs in os.walk(stage) for f in fs}
    tap.is_(sorted(have), sorted(want), f"{how}: the staged tree is the module, the control file, "
            f"the {version} install script, the {len(upgrades)} upgrade script(s) and the "
            f"{len(released)} released install script(s)")

    def read(path):
        return open(path, "rb").read() if os.path.exists(path) else b""

    control = read(os.path.join(ext_dir, f"{EXTENSION}.control")).decode()
    module = read(os.path.join(pkglib, f"{EXTENSION}.so"))
    # The module is compiled with PG_THROTTLE_VERSION, the control file's version.
    tap.ok(default_version(control) == version and f"{version}\0".encode() in module,
           f"{how}: the staged control file and module both carry {version}",
           f"control default_version: {default_version(control)!r}")
    same = [name for name in upgrades if read(os.path.join(ext_dir, name)) == release[f"src/sql/upgrade/{name}"]]
    same += [name for name, text in sorted(released.items()) if read(os.path.join(ext_dir, name)) == text]
    tap.is_(same, list(upgrades) + sorted(released),
            f"{how}: every staged upgrade and released install script is the release's own")


def main():
    tap = Tap(21)
    scratch = tempfile.mkdtemp(prefix="pg_throttle-dist-")
    try:
        check(tap, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tap.done()


def check(tap, scratch):
    version = default_version(git("show", f"HEAD:{EXTENSION}.control").decode())
    prefix = f"{EXTENSION}-{version}/"
    dist_dir = os.path.join(scratch, "dist")
    zips_in_tree = sorted(glob.glob(os.path.join(ROOT, "*.zip")) + glob.glob(os.path.join(ROOT, "build", "*.zip")))

    # The release, built as docs/install.md says.
    proc = subprocess.run(["make", "-s", "-C", ROOT, "dist", f"DIST_DIR={dist_dir}", f"PG_CONFIG={PG_CONFIG}"],
                          capture_output=True, text=True)
    tap.ok(proc.returncode == 0, "make dist DIST_DIR=... succeeds", proc.stdout + proc.stderr)
    zip_path = os.path.join(dist_dir, f"{EXTENSION}-{version}.zip")
    tap.is_(sorted(os.listdir(dist_dir)) if os.path.isdir(dist_dir) else [], [os.path.basename(zip_path)],
            f"DIST_DIR holds {EXTENSION}-{version}.zip (HEAD's version) and nothing else")
    tap.is_(sorted(glob.glob(os.path.join(ROOT, "*.zip")) + glob.glob(os.path.join(ROOT, "build", "*.zip"))),
            zips_in_tree, "no zip is left in the work tree")
    if not os.path.exists(zip_path):
        return

    with zipfile.ZipFile(zip_path) as zf:
        entries = zf.namelist()
        files = [n for n in entries if not n.endswith("/")]
        release = {n[len(prefix):]: zf.read(n) for n in files if n.startswith(prefix)}
    tap.is_([n for n in entries if not n.startswith(prefix)], [], f"every entry is under one top folder {prefix}")

    committed = git("ls-tree", "-r", "-z", "--name-only", "HEAD").decode().rstrip("\0").split("\0")
    ignored = export_ignored(committed, scratch)
    shipped = sorted(set(committed) - ignored)
    tap.is_(sorted(release), shipped, f"the zip holds the {len(shipped)} files committed at HEAD "
            f"that .gitattributes does not mark export-ignore ({len(ignored)} it marks)")
    blobs = head_blobs(shipped)
    differing = [f for f in shipped if release.get(f) != blobs[f]]
    tap.is_(differing, [], "each file in the zip is byte for byte its HEAD version")
    needed = ["META.json", "Makefile", f"{EXTENSION}.control", "README.md", "src/sql/pg_throttle.sql"]
    tap.is_([f for f in needed if f not in release], [], "META.json, Makefile, control file, README and SQL ship")

    # PGXN's view: pgxnclient reads the first META.json it finds in the zip
    # (pgxnclient.archive), so that one must be the release's.
    sys.path.append("/usr/lib/python3/dist-packages")
    try:
        from pgxnclient import archive
        meta = archive.from_file(zip_path).get_meta()
    except Exception as e:  # noqa: BLE001 - reported as the failed assertion
        meta = {}
        tap.ok(False, "pgxnclient reads META.json from the zip", f"{type(e).__name__}: {e}\n"
               "(apt-get install pgxnclient)")
    else:
        tap.is_(meta, json.loads(release.get("META.json", b"{}")), "pgxnclient reads the zip's top-level META.json")
    provided = meta.get("provides", {}).get(EXTENSION, {})
    tap.ok(meta.get("name") == EXTENSION and meta.get("version") == version == provided.get("version"),
           f"META.json names {EXTENSION} {version}, and provides {EXTENSION} at {version}",
           f"name {meta.get('name')!r}, version {meta.get('version')!r}, provides {provided!r}")
    tap.ok(provided.get("file") in release and provided.get("docfile") in release,
           "the provided file and docfile are in the zip", f"provides: {provided!r}")
    tap.is_(default_version(release.get(f"{EXTENSION}.control", b"").decode()), version,
            "the zip's control file carries the version the zip is named for")

    upgrades = sorted(m.group(1) for m in map(UPGRADE.match, release) if m)
    # Every upgrade script starts a chain of upgrade scripts that reaches the
    # release's version, so ALTER EXTENSION ... UPDATE works from each.
    steps = {m.group(2): m.group(3) for m in map(UPGRADE.match, release) if m}
    stranded = []
    for start in steps:
        seen, at = set(), start
        while at in steps and at not in seen:
            seen.add(at)
            at = steps[at]
        if at != version:
            stranded.append(start)
    tap.is_(stranded, [], f"each of the {len(upgrades)} upgrade script(s) leads to {version}")

    before = system_install()

    # (a) What a PGXN user runs: pgxn install, here into a staging DESTDIR
    # (pgxnclient passes its environment to make). --sudo=env stands in for
    # sudo when the library folder is not writable, so a non-root run stages too.
    stage_a = os.path.join(scratch, "stage-pgxn")
    env = dict(os.environ, DESTDIR=stage_a, MAKEFLAGS="-j2")
    ok, log = run(["pgxn", "install", f"--pg_config={PG_CONFIG}", "--sudo=env", zip_path], scratch, env)
    tap.ok(ok, "pgxn install ./zip builds and installs into the staging DESTDIR", log)
    check_stage(tap, "pgxn install", stage_a, version, upgrades, release)

    # (b) By hand: unzip in a fresh folder, make, make install DESTDIR=...
    unpacked = os.path.join(scratch, "unpacked")
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(unpacked)
    stage_b = os.path.join(scratch, "stage-make")
    tree = os.path.join(unpacked, prefix)
    env = {k: v for k, v in os.environ.items() if k not in ("DESTDIR", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    ok, log = run(["make", "-j2", f"PG_CONFIG={PG_CONFIG}"], tree, env)
    if ok:
        ok, log = run(["make", f"PG_CONFIG={PG_CONFIG}", "install", f"DESTDIR={stage_b}"], tree, env)
    tap.ok(ok, "unzip, make and make install DESTDIR=... succeed", log)
    check_stage(tap, "make install", stage_b, version, upgrades, release)

    tap.is_(system_install(), before, "the system's installed extension is untouched")


if __name__ == "__main__":
    main()
