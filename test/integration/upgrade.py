#!/usr/bin/python3
"""The upgrade path from 0.1.0: the released 0.1.0 is built from the git
history and installed; a database is filled with events in every state,
declared resources and registry state (an interval granted, a bucket
drained, a lease held); then the current version is installed, the server
restarted and ALTER EXTENSION pg_throttle UPDATE run. Nothing may be lost,
every function must work, and the updated database must have exactly the
objects of a fresh install (functions, tables, columns, indexes,
constraints, views, comments, privileges).

Installs into the server it runs against, so it runs on a cluster of its own,
and puts the current version back when it ends, whatever happened.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from cluster import execute, pg_ctlcluster, reconnect  # noqa: E402
from pgconn import connect, one  # noqa: E402
from tap import Tap  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OLD_DB, FRESH_DB = "upgrade_from_010", "upgrade_fresh"


def make(directory, *targets):
    config = os.environ.get("PG_CONFIG", "pg_config")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    subprocess.run(sudo + ["make", "-C", directory, "-s", f"PG_CONFIG={config}", *targets], check=True,
                   stdout=subprocess.DEVNULL)


def release_source(version):
    """The source of a released version (test/releases): from the git history,
    or, in a copy without it, from build/releases/<version>.tar."""
    with open(os.path.join(ROOT, "test", "releases")) as f:
        commit = dict(line.split() for line in f if line.strip() and not line.startswith("#"))[version]
    if os.path.isdir(os.path.join(ROOT, ".git")):
        return subprocess.run(["git", "-C", ROOT, "archive", commit], check=True, capture_output=True).stdout
    with open(os.path.join(ROOT, "build", "releases", version + ".tar"), "rb") as f:
        return f.read()


def install_release(directory):
    archive = release_source("0.1.0")
    subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
    make(directory, "-j2")
    make(directory, "install")


def restart():
    pg_ctlcluster("restart", "-m", "fast")
    return reconnect()


def recreate(admin, db):
    execute(admin, f"DROP DATABASE IF EXISTS {db}")
    execute(admin, f"CREATE DATABASE {db}")


# Every object of the extension, described so that two databases can be
# compared: one row per object, "kind name: definition".
CATALOG = """
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'pg_throttle'),
ns AS (SELECT 'throttle'::regnamespace AS oid)
SELECT 'function ' || p.oid::regprocedure || ': ' || pg_get_functiondef(p.oid)
       || ' comment ' || coalesce(obj_description(p.oid, 'pg_proc'), '-')
       || ' acl ' || coalesce(p.proacl::text, '-')
FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
WHERE d.refobjid = (SELECT oid FROM ext) AND d.deptype = 'e' AND p.prokind IN ('f', 'p')
UNION ALL
SELECT 'relation ' || c.relname || ': ' || c.relkind::text || ' '
       || coalesce(CASE c.relkind WHEN 'i' THEN pg_get_indexdef(c.oid)
                                   WHEN 'v' THEN pg_get_viewdef(c.oid) END, '')
       || ' comment ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
       || ' acl ' || coalesce(c.relacl::text, '-')
FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind <> 'S'
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ': ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), '')
       || CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END
       || ' comment ' || coalesce(col_description(c.oid, a.attnum), '-')
       || ' acl ' || coalesce(a.attacl::text, '-') || ' number ' || a.attnum
FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef ad ON ad.adrelid = c.oid AND ad.adnum = a.attnum
WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind IN ('r', 'v')
UNION ALL
SELECT 'constraint ' || conrelid::regclass || '.' || conname || ': ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = (SELECT oid FROM ns)
UNION ALL
SELECT 'config dump: ' || array_to_string(extconfig::regclass[]::text[], ',') || ' '
       || array_to_string(extcondition, ',')
FROM pg_extension WHERE extname = 'pg_throttle'
ORDER BY 1
"""


def fill(conn):
    """Events in every state, a declared resource and bucket, registry state."""
    for sql in [
        "INSERT INTO throttle.resource (name, every) VALUES ('nightly', '1 day')",
        "INSERT INTO throttle.bucket (name, rate, per, burst) VALUES ('api', 10, '1 minute', 5)",
        "SELECT throttle.schedule('mail', 'pending', now() + interval '1 hour')",
        "SELECT throttle.schedule('mail', 'claimed', now())",
        "SELECT throttle.schedule('mail', 'done', now())",
        "SELECT throttle.schedule('mail', 'dead', now(), max_attempts => 1)",
        "SELECT throttle.schedule('mail', 'cancelled', now() + interval '1 hour')",
        "SELECT throttle.schedule('orders', 'o1', now(), group_key => 'customer:1')",
        "SELECT throttle.schedule('orders', 'o2', now(), group_key => 'customer:2')",
    ]:
        execute(conn, sql)
    execute(conn, "SELECT throttle.cancel('mail', 'cancelled')")
    # One claim per event, in order: done, dead (after its one attempt), claimed.
    for key in ("done", "dead", "claimed"):
        execute(conn, "UPDATE throttle.event SET run_at = now() - interval '1 day' WHERE item_key = %s", (key,))
        event_id = one(conn, "SELECT id FROM throttle.claim('mail', 'worker-1', '1 hour')")[0]
        if key == "done":
            execute(conn, "SELECT throttle.complete(ARRAY[%s]::bigint[], 'worker-1')", (event_id,))
        elif key == "dead":
            execute(conn, "SELECT throttle.fail(ARRAY[%s]::bigint[], 'worker-1', 'boom')", (event_id,))
    one(conn, "SELECT id FROM throttle.claim_group('orders', 'worker-2', '1 hour')")
    one(conn, "SELECT throttle.acquire('nightly')")
    one(conn, "SELECT throttle.take('api', 5)")
    return one(conn, "SELECT throttle.lock('migration', ttl => '30 seconds')")[0]


STATES = "SELECT state, item_key, attempts, claimed_by FROM throttle.event ORDER BY id"
# After the update done and cancelled events are in throttle.event_history.
STATES_UPDATED = STATES.replace("throttle.event", "throttle.all_events")


# Functions whose privileges an operator changed under 0.1.0: their
# signature there, and in the current version.
OPERATOR_ACL = {
    "throttle.claim_group(text, text, interval)": "throttle.claim_group(text, text, interval, integer)",
    "throttle.complete(bigint[], text)": "throttle.complete(bigint[], bigint)",
}


def main():
    tap = Tap(19)
    admin = connect()
    recreate(admin, OLD_DB)
    recreate(admin, FRESH_DB)
    with tempfile.TemporaryDirectory() as release:
        try:
            install_release(release)
            admin.close()
            admin = restart()
            old = connect(dbname=OLD_DB)
            execute(old, "CREATE EXTENSION pg_throttle VERSION '0.1.0'")
            tap.is_(one(old, "SELECT extversion FROM pg_extension WHERE extname = 'pg_throttle'")[0], "0.1.0",
                    "0.1.0, built from the git history, is installed")
            token = fill(old)
            with old.cursor() as cur:
                cur.execute(STATES)
                before = cur.fetchall()
            tap.is_(sorted({row[0] for row in before}), ["cancelled", "claimed", "dead", "done", "pending"],
                    "it holds events in every state")
            old.close()
        finally:
            make(ROOT, "install")
    admin.close()
    admin = restart()
    old = connect(dbname=OLD_DB)
    tap.is_(one(old, "SELECT throttle.lock('migration', ttl => '30 seconds')")[0], None,
            "after the restart into the new module, the 0.1.0 lease is still held")
    # Until ALTER EXTENSION UPDATE runs, the 0.1.0 functions run on the new
    # library: every C symbol they name must still be there.
    execute(old, "BEGIN")
    execute(old, "SELECT throttle.schedule('legacy', 'l1', now(), group_key => 'g')")
    tap.is_(one(old, "SELECT count(*) FROM throttle.claim_group('legacy', 'w', '1 minute')")[0], 1,
            "before the update, 0.1.0's claim_group works on the new module")
    execute(old, "ROLLBACK")
    # An operator took claim_group and complete from PUBLIC and gave them to
    # one role; the update, which gives both a new signature, keeps that.
    for role in ("pgt_upgrade_worker", "pgt_upgrade_other"):
        execute(admin, f"DROP ROLE IF EXISTS {role}")
        execute(admin, f"CREATE ROLE {role}")
    for old_signature in OPERATOR_ACL:
        execute(old, f"REVOKE EXECUTE ON FUNCTION {old_signature} FROM PUBLIC")
        execute(old, f"GRANT EXECUTE ON FUNCTION {old_signature} TO pgt_upgrade_worker")
    # As in a 0.1.0 dump restored: its events' sequence starts again at 1.
    execute(old, "SELECT setval('throttle.event_id_seq', 1, false)")
    execute(old, "ALTER EXTENSION pg_throttle UPDATE")
    tap.is_([one(old, "SELECT has_function_privilege('pgt_upgrade_worker', CAST(%s AS regprocedure), 'EXECUTE'),"
                      " has_function_privilege('pgt_upgrade_other', CAST(%s AS regprocedure), 'EXECUTE')",
                 (new, new)) for new in OPERATOR_ACL.values()],
            [(True, False)] * len(OPERATOR_ACL),
            "claim_group and complete keep the privileges an operator gave them across the update")
    tap.is_(one(old, "SELECT extversion FROM pg_extension WHERE extname = 'pg_throttle'")[0],
            one(admin, "SELECT default_version FROM pg_available_extensions WHERE name = 'pg_throttle'")[0],
            "ALTER EXTENSION pg_throttle UPDATE reaches the current version")
    with old.cursor() as cur:
        cur.execute(STATES_UPDATED)
        tap.is_(cur.fetchall(), before, "every event is as it was: state, key, attempts, claimer")
    tap.is_(one(old, "SELECT (SELECT array_agg(DISTINCT state ORDER BY state) FROM throttle.event),"
                     " (SELECT array_agg(DISTINCT state ORDER BY state) FROM throttle.event_history)"),
            (["claimed", "dead", "pending"], ["cancelled", "done"]),
            "the done and cancelled events moved to throttle.event_history")
    tap.is_(one(old, "SELECT (SELECT count(*) FROM throttle.resource), (SELECT count(*) FROM throttle.bucket)"),
            (1, 1), "the declared resource and bucket are kept")
    tap.is_(one(old, "SELECT throttle.acquire('nightly')")[0], False,
            "the interval granted under 0.1.0 still holds")
    tap.is_(one(old, "SELECT throttle.unlock('migration', %s)", (token,))[0], True,
            "the lease taken under 0.1.0 is released with its token")

    fresh = connect(dbname=FRESH_DB)
    execute(fresh, "CREATE EXTENSION pg_throttle")
    for new_signature in OPERATOR_ACL.values():
        execute(fresh, f"REVOKE EXECUTE ON FUNCTION {new_signature} FROM PUBLIC")
        execute(fresh, f"GRANT EXECUTE ON FUNCTION {new_signature} TO pgt_upgrade_worker")
    with old.cursor() as cur:
        cur.execute(CATALOG)
        updated = [r[0] for r in cur.fetchall()]
    with fresh.cursor() as cur:
        cur.execute(CATALOG)
        installed = [r[0] for r in cur.fetchall()]
    only_updated = sorted(set(updated) - set(installed))
    only_fresh = sorted(set(installed) - set(updated))
    tap.ok(updated == installed and len(updated) > 50,
           f"the updated database has exactly the objects of a fresh install ({len(installed)})",
           "only after the update:\n" + "\n".join(only_updated) + "\nonly in a fresh install:\n"
           + "\n".join(only_fresh))

    # Every queue function works on the updated events.
    tap.is_(one(old, "SELECT count(*) FROM throttle.claim_group('orders', 'worker-3', '1 minute')")[0], 1,
            "the group claimed under 0.1.0 stays held; the other group is claimed")
    dead = one(old, "SELECT id FROM throttle.event WHERE state = 'dead'")[0]
    tap.is_(one(old, "SELECT throttle.retry(%s)", (dead,))[0], True, "a dead event is retried")
    execute(old, "SELECT throttle.reschedule('mail', 'pending', now())")
    got = one(old, "SELECT array_agg(item_key ORDER BY item_key), array_agg(id), min(claim_token) "
                   "FROM throttle.claim('mail', 'worker-4', '1 minute', max => 10)")
    tap.is_(got[0], ["dead", "pending"], "claim gets the rescheduled and the retried event, not the held one")
    tap.is_(one(old, "SELECT throttle.complete(%s, %s)", (got[1], got[2]))[0], 2, "complete takes the claim's token")
    # The 0.1.0 claim ends with its lease (its worker's calls are gone): a
    # session whose test clock is past it claims the event again.
    execute(old, "SET pg_throttle.test_clock = %s", (str(one(old, "SELECT now() + interval '2 hours'")[0]),))
    again = one(old, "SELECT item_key, attempts, claim_token FROM throttle.claim('mail', 'worker-5', '1 minute')")
    tap.is_(again[:2], ("claimed", 2), "a claim made under 0.1.0 is claimed again once its lease has ended")
    execute(old, "RESET pg_throttle.test_clock")
    execute(old, "SELECT throttle.schedule('mail', 'new', now())")
    tap.is_(one(old, "SELECT enqueued_by FROM throttle.event WHERE item_key = 'new'")[0],
            one(old, "SELECT current_user")[0], "schedule works, with the caller in enqueued_by")
    tap.ok(one(old, "SELECT (SELECT id FROM throttle.event WHERE item_key = 'new')"
                    " > (SELECT max(id) FROM throttle.all_events WHERE item_key <> 'new')")[0],
           "a new event's id follows every event's, finished ones included, though the sequence"
           " had started again at 1")
    old.close()
    fresh.close()
    execute(admin, f"DROP DATABASE {OLD_DB}")
    execute(admin, f"DROP DATABASE {FRESH_DB}")
    for role in ("pgt_upgrade_worker", "pgt_upgrade_other"):
        execute(admin, f"DROP ROLE {role}")
    admin.close()
    tap.done()


if __name__ == "__main__":
    main()
