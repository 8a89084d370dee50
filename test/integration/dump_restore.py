#!/usr/bin/python3
"""pg_dump keeps what the documentation says it keeps, and the restored queue works.

A database with declared resources and buckets, a rate-limited queue,
events in every state, with their attempts, and paused queues and groups, is dumped and restored into a
new database. Everything comes back, and the identity columns go on from
where they were: a new event or attempt never collides with a restored one.
"""
import os
import subprocess
import sys
import tempfile

import psycopg2

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one  # noqa: E402
from tap import Tap  # noqa: E402

SOURCE, TARGET = "pgt_dump_source", "pgt_dump_target"
OLD_SOURCE, OLD_TARGET = "pgt_dump_010", "pgt_restore_010"
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
OLD_RESTORE_MARK = "CREATE EXTENSION pg_throttle VERSION '0.1.0'"
CLOCK = "2032-03-01 12:00:00+00"
SNAPSHOTS = {
    "events": "SELECT md5(string_agg(e::text, '|' ORDER BY id)) FROM throttle.all_events e",
    "attempts": "SELECT md5(string_agg(a::text, '|' ORDER BY id)) FROM throttle.event_attempt a",
    "resources": "SELECT md5(string_agg(r::text, '|' ORDER BY name)) FROM throttle.resource r",
    "buckets": "SELECT md5(string_agg(b::text, '|' ORDER BY name)) FROM throttle.bucket b",
    "queue buckets": "SELECT md5(string_agg(q::text, '|' ORDER BY queue)) FROM throttle.queue_bucket q",
    "group buckets": "SELECT md5(string_agg(g::text, '|' ORDER BY queue)) FROM throttle.group_bucket g",
    "queue policies": "SELECT md5((SELECT string_agg(g::text, '|' ORDER BY queue) FROM throttle.group_policy g)"
                      " || (SELECT string_agg(c::text, '|' ORDER BY queue) FROM throttle.concurrency_policy c))",
    "pauses": "SELECT md5(string_agg(p::text, '|' ORDER BY queue, group_key)) FROM throttle.queue_pause p",
    "attempt histories": "SELECT md5(string_agg(h::text, '|' ORDER BY event_id, attempt, outcome)) "
                         "FROM throttle.attempt_history h",
}


def fill(conn):
    cur = conn.cursor()
    cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    cur.execute("INSERT INTO throttle.resource (name, every) VALUES ('nightly', '1 day')")
    cur.execute("INSERT INTO throttle.bucket (name, rate, per, burst) VALUES ('api', 10, '1 second', 5)")
    cur.execute("INSERT INTO throttle.queue_bucket (queue, bucket) VALUES ('limited', 'api')")
    cur.execute("INSERT INTO throttle.group_bucket (queue, bucket) VALUES ('grouped', 'api')")
    cur.execute("SELECT throttle.schedule('q', 'k' || g, %s::timestamptz - interval '1 minute') "
                "FROM generate_series(1, 6) g", (CLOCK,))
    cur.execute("SELECT throttle.schedule('q', 'last-try', %s::timestamptz - interval '2 minutes', "
                "max_attempts => 1)", (CLOCK,))
    cur.execute("SELECT throttle.schedule('limited', 'l1', %s)", (CLOCK,))
    cur.execute("INSERT INTO throttle.group_policy (queue, workers) VALUES ('grouped', 3)")
    cur.execute("INSERT INTO throttle.concurrency_policy (queue, max_claimed) VALUES ('keyed', 2)")
    cur.execute("SELECT throttle.schedule('keyed', 'r1', %s, concurrency_key => 'tenant-1')", (CLOCK,))
    cur.execute("SELECT array_agg(id ORDER BY id), min(claim_token) FROM throttle.claim('q', 'w', max => 7)")
    ids, token = cur.fetchone()    # by id: k1..k6, then last-try
    cur.execute("SELECT throttle.fail(%s, %s, 'boom')", (ids[6:7], token))           # dead
    cur.execute("SELECT throttle.complete(%s, %s)", (ids[0:2], token))              # done
    cur.execute("SELECT throttle.fail(%s, %s, 'boom', '1 hour')", (ids[2:4], token))  # pending
    cur.execute("SELECT throttle.schedule('q', 'later', %s::timestamptz + interval '1 day')", (CLOCK,))
    cur.execute("SELECT throttle.cancel('q', 'later')")                             # cancelled
    cur.execute("SELECT throttle.pause('limited'), throttle.pause('grouped', 'g1')")
    # ids[4:6] stay claimed.


def old_restore_procedure():
    """The restore of a 0.1.0 dump in docs/install.md (Upgrading): its sh block, less the
    first line, which names the database and the file."""
    lines = open(os.path.join(ROOT, "docs", "install.md")).read().splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.strip() == "```sh" and OLD_RESTORE_MARK in "\n".join(lines[i:i + 5]))
    end = next(j for j in range(start + 1, len(lines)) if lines[j].strip() == "```")
    assert lines[start + 1].startswith("db=")
    return "\n".join(lines[start + 2:end]) + "\n"


def restore_010(tap, admin):
    """A 0.1.0 database (the install script shipped for restores), with events
    in every state of 0.1.0 and a grant on purge, dumped and restored by the
    procedure of docs/install.md."""
    for db in (OLD_SOURCE, OLD_TARGET):
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {db}")
    admin.cursor().execute(f"CREATE DATABASE {OLD_SOURCE}")
    admin.cursor().execute("DROP ROLE IF EXISTS pgt_dump_purger")
    admin.cursor().execute("CREATE ROLE pgt_dump_purger")
    old = connect(dbname=OLD_SOURCE)
    cur = old.cursor()
    cur.execute("CREATE EXTENSION pg_throttle VERSION '0.1.0'")
    cur.execute("INSERT INTO throttle.resource (name, every) VALUES ('nightly', '1 day')")
    for key, when in [("pending", "1 hour"), ("done", "-1 hour"), ("dead", "-2 hours"),
                      ("cancelled", "1 hour"), ("claimed", "-3 hours")]:
        cur.execute("SELECT throttle.schedule('mail', %s, now() + %s::interval, max_attempts => 1)",
                    (key, when))
    cur.execute("SELECT throttle.cancel('mail', 'cancelled')")
    for key in ("claimed", "dead", "done"):   # the oldest due first
        cur.execute("SELECT id FROM throttle.claim('mail', 'w', '1 hour')")
        event = cur.fetchone()[0]
        if key == "done":
            cur.execute("SELECT throttle.complete(ARRAY[%s]::bigint[], 'w')", (event,))
        elif key == "dead":
            cur.execute("SELECT throttle.fail(ARRAY[%s]::bigint[], 'w', 'boom')", (event,))
    cur.execute("GRANT EXECUTE ON FUNCTION throttle.purge(interval) TO pgt_dump_purger")
    before = sorted(fetch_all(old, "SELECT item_key, state, attempts FROM throttle.event"))
    old.close()
    with tempfile.TemporaryDirectory() as work:
        os.chmod(work, 0o777)
        dump = os.path.join(work, "app-0.1.0.dump")
        subprocess.run(["pg_dump", "-Fc", "-d", OLD_SOURCE, "-f", dump], check=True)
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", old_restore_procedure()], cwd=work,
                              env=dict(os.environ, db=OLD_TARGET, dump=dump), capture_output=True, text=True)
    tap.is_(done.returncode, 0, "the restore of a 0.1.0 dump in docs/install.md runs as written" +
            (f": {done.stderr.strip()[:400]}" if done.returncode else ""))
    target = connect(dbname=OLD_TARGET)
    tap.is_((one(target, "SELECT extversion FROM pg_extension WHERE extname = 'pg_throttle'")[0],
             sorted(fetch_all(target, "SELECT item_key, state, attempts FROM throttle.all_events"))),
            (one(admin, "SELECT default_version FROM pg_available_extensions WHERE name = 'pg_throttle'")[0],
             before),
            "it reaches the current version with every event of the dump, done and cancelled ones included")
    tap.ok(one(target, "SELECT has_function_privilege('pgt_dump_purger', "
                       "'throttle.purge(interval, text, text[])', 'EXECUTE')")[0],
           "the grant on purge made under 0.1.0 is carried over to the new purge")
    target.close()
    for db in (OLD_SOURCE, OLD_TARGET):
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {db}")
    admin.cursor().execute("DROP ROLE pgt_dump_purger")


def fetch_all(conn, sql):
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def snapshot(conn):
    return {name: one(conn, sql)[0] for name, sql in SNAPSHOTS.items()}


def main():
    tap = Tap(17)
    admin = connect()
    for db in (SOURCE, TARGET):
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {db}")
        admin.cursor().execute(f"CREATE DATABASE {db}")
    source = connect(dbname=SOURCE)
    source.cursor().execute("CREATE EXTENSION pg_throttle")
    fill(source)
    states = one(source, "SELECT array_agg(DISTINCT state ORDER BY state) FROM throttle.all_events")[0]
    tap.is_(states, ["cancelled", "claimed", "dead", "done", "pending"],
            "the source has events in every state")
    before = snapshot(source)
    max_event, max_attempt = one(source, "SELECT (SELECT max(id) FROM throttle.all_events), "
                                          "(SELECT max(id) FROM throttle.event_attempt)")

    dump = subprocess.run(["pg_dump", "-d", SOURCE], check=True, capture_output=True, text=True).stdout
    restore = subprocess.run(["psql", "-qX", "-v", "ON_ERROR_STOP=1", "-d", TARGET],
                             input=dump, capture_output=True, text=True)
    tap.is_(restore.returncode, 0, "the dump restores without an error" +
            (f": {restore.stderr.strip()[:300]}" if restore.returncode else ""))

    target = connect(dbname=TARGET)
    after = snapshot(target)
    for name in SNAPSHOTS:
        tap.is_(after[name], before[name], f"the {name} come back as they were")
    cur = target.cursor()
    cur.execute("SET pg_throttle.test_clock = %s", (CLOCK,))
    try:
        cur.execute("SELECT throttle.schedule('q', 'after-restore', %s)", (CLOCK,))
        new_id = cur.fetchone()[0]
    except psycopg2.Error as e:
        new_id = f"none: {e.pgcode} {e.diag.message_primary}"
    tap.ok(isinstance(new_id, int) and new_id > max_event,
           f"a new event gets a new id ({new_id} > {max_event})")
    cur.execute("SELECT id, claim_token FROM throttle.claim('q', 'w3', max => 10) "
                "WHERE item_key = 'after-restore'")
    row = cur.fetchone()
    tap.ok(row is not None, "and is claimed")
    if row:
        cur.execute("SELECT throttle.fail(%s, %s, 'after restore')", ([row[0]], row[1]))
    attempt_id = one(target, "SELECT max(id) FROM throttle.event_attempt")[0]
    tap.ok(attempt_id > max_attempt, f"a new attempt gets a new id ({attempt_id} > {max_attempt})")
    for conn in (source, target):
        conn.close()
    for db in (SOURCE, TARGET):
        admin.cursor().execute(f"DROP DATABASE {db}")
    restore_010(tap, admin)
    admin.close()
    tap.done()


if __name__ == "__main__":
    main()
