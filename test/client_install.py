#!/usr/bin/python3
"""The client packages install the way a user installs them, with no network but
the npm registry: `pip install --no-build-isolation clients/python` into a fresh
virtual environment (with no index at all), `npm install` of the tarballs
`npm pack` makes of clients/node and clients/dashboard into an empty project, and
`npm install` from the repository path. The installed packages import, the
dashboard's command answers --help, and every package's version is the
extension's (pg_throttle.control's default_version). Needs python3-venv,
python3-pip, python3-setuptools and npm. Prints TAP for prove.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "integration"))
from tap import Tap  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
NPM_QUIET = ["--no-audit", "--no-fund", "--loglevel=error"]


def run(cmd, cwd=None):
    """(exit code, stdout + stderr) of `cmd`."""
    done = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.returncode, done.stdout


def extension_version():
    with open(os.path.join(ROOT, "pg_throttle.control")) as control:
        return re.search(r"^default_version = '([^']+)'", control.read(), re.M).group(1)


def package_json(name):
    with open(os.path.join(ROOT, "clients", name, "package.json")) as f:
        return json.load(f)


def pyproject_version():
    with open(os.path.join(ROOT, "clients", "python", "pyproject.toml")) as f:
        return re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)


tap = Tap(11)
version = extension_version()
tap.is_(package_json("node")["version"], version, "clients/node's version is the extension's")
tap.is_(package_json("dashboard")["version"], version, "clients/dashboard's version is the extension's")
tap.is_(pyproject_version(), version, "clients/python's version is the extension's")

with tempfile.TemporaryDirectory() as tmp:
    venv = os.path.join(tmp, "venv")
    rc, out = run([sys.executable, "-m", "venv", "--system-site-packages", venv])
    rc, out = (rc, out) if rc else run([os.path.join(venv, "bin", "pip"), "install", "--no-index",
                                        "--no-build-isolation", "--quiet",
                                        os.path.join(ROOT, "clients", "python")], cwd=tmp)
    tap.ok(rc == 0, "pip install --no-build-isolation clients/python, with no index", out)
    rc, out = run([os.path.join(venv, "bin", "python"), "-c",
                   "import pg_throttle, os; print(pg_throttle.__version__, os.path.dirname(pg_throttle.__file__))"],
                  cwd=tmp)
    installed = out.split()
    tap.ok(rc == 0 and installed[0] == version and installed[1].startswith(venv),
           "the installed pg_throttle imports from the environment, with the extension's version", out)

    packs = os.path.join(tmp, "packs")
    os.mkdir(packs)
    tarballs = {}
    for name in ("node", "dashboard"):
        rc, out = run(["npm", "pack", "--pack-destination", packs, *NPM_QUIET],
                      cwd=os.path.join(ROOT, "clients", name))
        tarball = os.path.join(packs, out.strip().splitlines()[-1]) if rc == 0 and out.strip() else ""
        tarballs[name] = tarball
        tap.ok(rc == 0 and os.path.exists(tarball), f"npm pack makes clients/{name}'s tarball", out)

    app = os.path.join(tmp, "app")
    os.mkdir(app)
    with open(os.path.join(app, "package.json"), "w") as f:
        json.dump({"name": "app", "version": "1.0.0", "private": True}, f)
    rc, out = run(["npm", "install", *NPM_QUIET, tarballs["node"], tarballs["dashboard"]], cwd=app)
    tap.ok(rc == 0, "npm install of the two tarballs into an empty project", out)
    rc, out = run(["node", "-e", "const t = require('pg-throttle');"
                   " for (const n of ['Worker', 'schedule', 'scheduleMany', 'cancel', 'withLease',"
                   " 'rateLimit']) if (!t[n]) throw new Error('missing ' + n);"
                   " console.log(require('pg-throttle/package.json').version)"], cwd=app)
    tap.ok(rc == 0 and out.strip() == version, "the installed pg-throttle exports its API", out)
    rc, out = run(["npx", "--no-install", "pg-throttle-dashboard", "--help"], cwd=app)
    tap.ok(rc == 0 and "--database" in out, "npx pg-throttle-dashboard --help, from the installed tarball", out)

    from_path = os.path.join(tmp, "from-path")
    os.mkdir(from_path)
    with open(os.path.join(from_path, "package.json"), "w") as f:
        json.dump({"name": "from-path", "version": "1.0.0", "private": True}, f)
    rc, out = run(["npm", "install", "--install-links", *NPM_QUIET, os.path.join(ROOT, "clients", "node")],
                  cwd=from_path)
    rc, out = (rc, out) if rc else run(["node", "-e", "require('pg-throttle').Worker"], cwd=from_path)
    tap.ok(rc == 0, "npm install from the repository path, and require", out)
tap.done()
