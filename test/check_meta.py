#!/usr/bin/python3
"""META.json follows PGXN meta-spec 1.0.0 and carries the control file's version.

The version is set once, in pg_throttle.control; everything else must agree.
Prints TAP for prove.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "integration"))
from tap import Tap  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")
SEMVER = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z-]+)?$")
LICENSES = {"agpl_3", "apache_1_1", "apache_2_0", "artistic_1", "artistic_2", "bsd", "freebsd",
            "gfdl_1_2", "gfdl_1_3", "gpl_1", "gpl_2", "gpl_3", "lgpl_2_1", "lgpl_3_0", "mit",
            "mozilla_1_0", "mozilla_1_1", "openssl", "perl_5", "postgresql", "qpl_1_0",
            "ssleay", "sun", "zlib", "open_source", "restricted", "unrestricted", "unknown"}


def main():
    tap = Tap(12)
    with open(os.path.join(ROOT, "META.json")) as f:
        meta = json.load(f)
    with open(os.path.join(ROOT, "pg_throttle.control")) as f:
        control = f.read()
    version = re.search(r"^default_version = '([^']*)'", control, re.M).group(1)

    for key in ("name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"):
        tap.ok(key in meta, f"META.json has the required key {key}")
    tap.is_(meta["meta-spec"]["version"], "1.0.0", "meta-spec version 1.0.0")
    tap.ok(SEMVER.match(meta["version"]) and meta["license"] in LICENSES,
           "version is semantic and the license is one the spec names")
    tap.is_(meta["version"], version, "META.json's version is the control file's")
    provided = meta["provides"].get("pg_throttle", {})
    tap.ok(provided.get("version") == version and os.path.exists(os.path.join(ROOT, provided.get("file", ""))),
           "provides pg_throttle at the same version, from a file that exists")
    tap.ok(SEMVER.match(version) is not None, "the control file's version is semantic")
    tap.done()


if __name__ == "__main__":
    main()
