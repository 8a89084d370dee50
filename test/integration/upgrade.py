#!/usr/bin/python3
"""The upgrade paths from 0.1.0 (through 0.2.0 and 0.3.0), from 0.2.0 and from
0.3.0 (with claims in force across the update): the released
versions are built from the git history and installed in turn; a database of
each is filled with events in every state, declared resources, registry state
(an interval granted, a bucket drained, a lease held) and privileges an
operator changed; then the current version is installed, the server
restarted and ALTER EXTENSION pg_throttle UPDATE run in both. Nothing may be lost,
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
MID_DB, MID_FRESH_DB = "upgrade_from_020", "upgrade_fresh_020"
LAST_DB, LAST_FRESH_DB = "upgrade_from_030", "upgrade_fresh_030"


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
    if os.path.exists(os.path.join(ROOT, ".git")):  # a directory, or a worktree's file
        return subprocess.run(["git", "-C", ROOT, "archive", commit], check=True, capture_output=True).stdout
    with open(os.path.join(ROOT, "build", "releases", version + ".tar"), "rb") as f:
        return f.read()


def build_release(directory, version):
    archive = release_source(version)
    subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
    make(directory, "-j2")


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
SELECT 'trigger ' || tgname || ': ' || pg_get_triggerdef(t.oid) || ' enabled ' || t.tgenabled::text
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = (SELECT oid FROM ns) AND NOT t.tgisinternal
UNION ALL
SELECT 'config dump: ' || array_to_string(extconfig::regclass[]::text[], ',') || ' '
       || array_to_string(extcondition, ',')
FROM pg_extension WHERE extname = 'pg_throttle'
UNION ALL
-- The extension's initial privileges, which pg_dump leaves out: an
-- operator's grant recorded here would not survive a dump and restore.
SELECT 'initial privileges ' || CASE i.classoid
           WHEN 'pg_proc'::regclass THEN i.objoid::regprocedure::text
           WHEN 'pg_class'::regclass THEN i.objoid::regclass::text
           ELSE i.classoid::regclass::text END
       || ' ' || i.objsubid || ': ' || i.initprivs::text
FROM pg_init_privs i
WHERE (i.classoid = 'pg_proc'::regclass
       AND i.objoid IN (SELECT oid FROM pg_proc WHERE pronamespace = (SELECT oid FROM ns)))
   OR (i.classoid = 'pg_class'::regclass
       AND i.objoid IN (SELECT oid FROM pg_class WHERE relnamespace = (SELECT oid FROM ns)))
   OR (i.classoid = 'pg_namespace'::regclass AND i.objoid = (SELECT oid FROM ns))
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
    "throttle.purge(interval)": "throttle.purge(interval, text, text[])",
}

# What an operator changed under 0.2.0: a function taken from PUBLIC and given
# to one role, an operator's function given to it, a view taken from PUBLIC
# (one the update replaces) and given to it.
OPERATOR_020 = [
    "REVOKE EXECUTE ON FUNCTION throttle.claim(text, text, interval, integer) FROM PUBLIC",
    "GRANT EXECUTE ON FUNCTION throttle.claim(text, text, interval, integer) TO pgt_upgrade_worker",
    "GRANT EXECUTE ON FUNCTION throttle.purge(interval, text, text[]) TO pgt_upgrade_worker",
    "REVOKE SELECT ON throttle.queue_metrics FROM PUBLIC",
    "GRANT SELECT ON throttle.queue_metrics TO pgt_upgrade_worker",
    "REVOKE EXECUTE ON FUNCTION throttle.registry_entries() FROM PUBLIC",
]


def fill_020(conn):
    """0.2.0: events in every state (done and cancelled in the history), a
    declared resource and bucket, registry state. Returns a lease's token."""
    for sql in [
        "INSERT INTO throttle.resource (name, every) VALUES ('nightly', '1 day')",
        "INSERT INTO throttle.bucket (name, rate, per, burst) VALUES ('api', 10, '1 minute', 5)",
        "SELECT throttle.schedule('mail', 'pending', now() + interval '1 hour')",
        "SELECT throttle.schedule('mail', 'cancelled', now() + interval '1 hour')",
        "SELECT throttle.cancel('mail', 'cancelled')",
        "SELECT throttle.schedule('mail', k, now() - interval '1 minute', max_attempts => 1)"
        " FROM unnest(ARRAY['claimed', 'dead', 'done']) k",
    ]:
        execute(conn, sql)
    ids, token = one(conn, "SELECT array_agg(id ORDER BY item_key), min(claim_token)"
                           " FROM throttle.claim('mail', 'worker-1', '1 hour', max => 3)")
    execute(conn, "SELECT throttle.fail(%s, %s, 'boom')", (ids[1:2], token))      # dead
    execute(conn, "SELECT throttle.complete(%s, %s)", (ids[2:3], token))          # done
    one(conn, "SELECT throttle.acquire('nightly')")
    one(conn, "SELECT throttle.take('api', 5)")
    return one(conn, "SELECT throttle.lock('migration', ttl => '5 minutes')")[0]


def fill_030(conn):
    """0.3.0: events in every state and claims in force at the update: an
    ungrouped claim, a group's claim and a strict group's claim of two
    events. Returns the claims: {name: (ids, token)}."""
    for sql in [
        "INSERT INTO throttle.group_policy (queue, strict_order) VALUES ('strict', true)",
        "SELECT throttle.schedule('mail', 'pending', now() + interval '1 hour')",
        "SELECT throttle.schedule('mail', 'cancelled', now() + interval '1 hour')",
        "SELECT throttle.cancel('mail', 'cancelled')",
        "SELECT throttle.schedule('mail', k, now() - interval '1 minute', max_attempts => 1)"
        " FROM unnest(ARRAY['dead', 'done']) k",
    ]:
        execute(conn, sql)
    ids, token = one(conn, "SELECT array_agg(id ORDER BY item_key), min(claim_token)"
                           " FROM throttle.claim('mail', 'worker-1', '1 hour', max => 2)")
    execute(conn, "SELECT throttle.fail(%s, %s, 'boom')", (ids[0:1], token))      # dead
    execute(conn, "SELECT throttle.complete(%s, %s)", (ids[1:2], token))          # done
    execute(conn, "SELECT throttle.schedule('mail', 'held', now() - interval '1 minute')")
    execute(conn, "SELECT throttle.schedule('orders', k, now() - interval '1 minute', group_key => 'c1')"
                  " FROM unnest(ARRAY['o1', 'o2']) k")
    execute(conn, "SELECT throttle.schedule('strict', k, now() - interval '1 minute', group_key => 's1')"
                  " FROM unnest(ARRAY['s1', 's2']) k")
    # 0.3.0's release_group left an event pending on its last attempt
    # (0.4.0 makes it dead): the update makes such leftovers dead.
    execute(conn, "SELECT throttle.schedule('leftover', 'spent', now() - interval '1 minute',"
                  " group_key => 'g', max_attempts => 1)")
    one(conn, "SELECT count(*) FROM throttle.claim_group('leftover', 'worker-5', '1 hour')")
    execute(conn, "SELECT throttle.release_group('leftover', 'g')")
    claims = {}
    for name, call in [("held", "throttle.claim('mail', 'worker-2', '1 hour')"),
                       ("group", "throttle.claim_group('orders', 'worker-3', '1 hour')"),
                       ("strict", "throttle.claim_group('strict', 'worker-4', '1 hour')")]:
        got = one(conn, f"SELECT array_agg(id ORDER BY id), min(claim_token) FROM {call}")
        claims[name] = (got[0], got[1])
    return claims


def catalog_difference(updated_conn, fresh_conn):
    with updated_conn.cursor() as cur:
        cur.execute(CATALOG)
        updated = [r[0] for r in cur.fetchall()]
    with fresh_conn.cursor() as cur:
        cur.execute(CATALOG)
        installed = [r[0] for r in cur.fetchall()]
    only_updated = sorted(set(updated) - set(installed))
    only_fresh = sorted(set(installed) - set(updated))
    return (updated == installed and len(updated) > 50, len(installed),
            "only after the update:\n" + "\n".join(only_updated) + "\nonly in a fresh install:\n"
            + "\n".join(only_fresh))


def main():
    tap = Tap(41)
    admin = connect()
    for db in (OLD_DB, FRESH_DB, MID_DB, MID_FRESH_DB, LAST_DB, LAST_FRESH_DB):
        recreate(admin, db)
    for role in ("pgt_upgrade_worker", "pgt_upgrade_other"):
        execute(admin, f"DROP ROLE IF EXISTS {role}")
        execute(admin, f"CREATE ROLE {role}")
    with tempfile.TemporaryDirectory() as release, tempfile.TemporaryDirectory() as release_020, \
            tempfile.TemporaryDirectory() as release_030:
        # All built before any is installed: the leases taken below must not
        # run out while one compiles.
        build_release(release, "0.1.0")
        build_release(release_020, "0.2.0")
        build_release(release_030, "0.3.0")
        try:
            make(release, "install")
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
            # 0.2.0, over it: the 0.1.0 database keeps running on its module.
            make(release_020, "install")
            admin.close()
            admin = restart()
            mid = connect(dbname=MID_DB)
            execute(mid, "CREATE EXTENSION pg_throttle VERSION '0.2.0'")
            tap.is_(one(mid, "SELECT extversion FROM pg_extension WHERE extname = 'pg_throttle'")[0], "0.2.0",
                    "0.2.0, built from the git history, is installed")
            token_020 = fill_020(mid)
            for sql in OPERATOR_020:
                execute(mid, sql)
            with mid.cursor() as cur:
                cur.execute(STATES_UPDATED)
                before_020 = cur.fetchall()
            tap.is_(sorted({row[0] for row in before_020}), ["cancelled", "claimed", "dead", "done", "pending"],
                    "it holds events in every state")
            mid.close()
            # 0.3.0, over both.
            make(release_030, "install")
            admin.close()
            admin = restart()
            last = connect(dbname=LAST_DB)
            execute(last, "CREATE EXTENSION pg_throttle VERSION '0.3.0'")
            tap.is_(one(last, "SELECT extversion FROM pg_extension WHERE extname = 'pg_throttle'")[0], "0.3.0",
                    "0.3.0, built from the git history, is installed")
            claims_030 = fill_030(last)
            with last.cursor() as cur:
                cur.execute(STATES_UPDATED)
                before_030 = cur.fetchall()
            tap.is_(sorted({row[0] for row in before_030}), ["cancelled", "claimed", "dead", "done", "pending"],
                    "it holds events in every state, and claims in force")
            last.close()
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
    # An operator took claim_group and complete from PUBLIC and gave them and
    # purge (which 0.1.0 had taken from PUBLIC) to one role; the update,
    # which gives them new signatures, keeps that.
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
            "claim_group, complete and purge keep the privileges an operator gave them across the update")
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
    same, count, difference = catalog_difference(old, fresh)
    tap.ok(same, f"the updated database has exactly the objects of a fresh install ({count})", difference)

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
    from_020(tap, admin, token_020, before_020)
    from_030(tap, admin, claims_030, before_030)
    for db in (OLD_DB, FRESH_DB, MID_DB, MID_FRESH_DB, LAST_DB, LAST_FRESH_DB):
        execute(admin, f"DROP DATABASE {db}")
    for role in ("pgt_upgrade_worker", "pgt_upgrade_other"):
        execute(admin, f"DROP ROLE {role}")
    admin.close()
    tap.done()


def from_020(tap, admin, token, before):
    """The 0.2.0 database, updated to the current version."""
    mid = connect(dbname=MID_DB)
    execute(mid, "ALTER EXTENSION pg_throttle UPDATE")
    tap.is_(one(mid, "SELECT extversion FROM pg_extension WHERE extname = 'pg_throttle'")[0],
            one(admin, "SELECT default_version FROM pg_available_extensions WHERE name = 'pg_throttle'")[0],
            "from 0.2.0, ALTER EXTENSION pg_throttle UPDATE reaches the current version")
    with mid.cursor() as cur:
        cur.execute(STATES_UPDATED)
        tap.is_(cur.fetchall(), before, "from 0.2.0, every event is as it was")
    privileges = one(mid, "SELECT has_function_privilege('pgt_upgrade_worker', "
                          "'throttle.claim(text, text, interval, integer)', 'EXECUTE'),"
                          " has_function_privilege('pgt_upgrade_other', "
                          "'throttle.claim(text, text, interval, integer)', 'EXECUTE'),"
                          " has_function_privilege('pgt_upgrade_worker', "
                          "'throttle.purge(interval, text, text[])', 'EXECUTE'),"
                          " has_table_privilege('pgt_upgrade_worker', 'throttle.queue_metrics', 'SELECT'),"
                          " has_table_privilege('pgt_upgrade_other', 'throttle.queue_metrics', 'SELECT'),"
                          " has_function_privilege('pgt_upgrade_other', 'throttle.registry_entries()', 'EXECUTE')")
    tap.is_(privileges, (True, False, True, True, False, False),
            "the privileges an operator changed under 0.2.0 are kept, on the replaced view too")
    fresh = connect(dbname=MID_FRESH_DB)
    execute(fresh, "CREATE EXTENSION pg_throttle")
    for sql in OPERATOR_020:
        execute(fresh, sql)
    same, count, difference = catalog_difference(mid, fresh)
    tap.ok(same, f"from 0.2.0, the updated database has exactly the objects of a fresh install ({count})",
           difference)
    tap.is_(one(mid, "SELECT count(*) FROM throttle.queue_metrics WHERE queue = 'mail'")[0], 1,
            "queue_metrics works on the updated database")
    tap.is_(one(mid, "SELECT throttle.acquire('nightly')")[0], False, "the interval granted under 0.2.0 still holds")
    tap.is_(one(mid, "SELECT throttle.unlock('migration', %s)", (token,))[0], True,
            "the lease taken under 0.2.0 is released with its token")
    mid.close()
    fresh.close()


def from_030(tap, admin, claims, before):
    """The 0.3.0 database, its claims in force, on the new module and then
    updated to the current version."""
    last = connect(dbname=LAST_DB)
    # Before the update, 0.3.0's SQL runs on the new module.
    execute(last, "BEGIN")
    execute(last, "SELECT throttle.schedule('legacy', k, now(), group_key => g)"
                  " FROM (VALUES ('l1', 'g'), ('l2', NULL)) AS v(k, g)")
    tap.is_(one(last, "SELECT (SELECT count(*) FROM throttle.claim_group('legacy', 'w', '1 minute')),"
                      " (SELECT count(*) FROM throttle.claim('legacy', 'w', '1 minute'))"),
            (1, 1), "before the update, 0.3.0's claim and claim_group work on the new module")
    execute(last, "ROLLBACK")
    execute(last, "ALTER EXTENSION pg_throttle UPDATE")
    tap.is_(one(last, "SELECT extversion FROM pg_extension WHERE extname = 'pg_throttle'")[0],
            one(admin, "SELECT default_version FROM pg_available_extensions WHERE name = 'pg_throttle'")[0],
            "from 0.3.0, ALTER EXTENSION pg_throttle UPDATE reaches the current version")
    spent = ("pending", "spent", 1, "worker-5")
    tap.ok(spent in before, "0.3.0 left an event pending with its attempts used up", before)
    with last.cursor() as cur:
        cur.execute(STATES_UPDATED)
        tap.is_(cur.fetchall(), [("dead",) + row[1:] if row == spent else row for row in before],
                "from 0.3.0, every event is as it was, but the one left pending without attempts is dead")
    tap.is_(one(last, "SELECT state, last_error FROM throttle.event WHERE queue = 'leftover'"),
            ("dead", "lease expired 1 times"), "it died as its next claim would have made it")
    fresh = connect(dbname=LAST_FRESH_DB)
    execute(fresh, "CREATE EXTENSION pg_throttle")
    same, count, difference = catalog_difference(last, fresh)
    tap.ok(same, f"from 0.3.0, the updated database has exactly the objects of a fresh install ({count})",
           difference)
    # The claims made under 0.3.0 still hold: nobody else gets their events,
    # and their workers end them with their tokens.
    tap.is_(one(last, "SELECT (SELECT count(*) FROM throttle.claim('mail', 'other', '1 minute')),"
                      " (SELECT count(*) FROM throttle.claim_group('orders', 'other', '1 minute')),"
                      " (SELECT count(*) FROM throttle.claim_group('strict', 'other', '1 minute'))"),
            (0, 0, 0), "from 0.3.0, the claims in force at the update are nobody else's")
    ids, token = claims["strict"]
    tap.is_(one(last, "SELECT throttle.complete(%s, %s)", (ids[:1], token))[0], 1,
            "the strict group's claim completes its first event with its token")
    tap.is_(one(last, "SELECT throttle.fail(%s, %s, 'later')", (ids[1:], token))[0], 1,
            "and fails the second")
    ended = [one(last, "SELECT throttle.complete(%s, %s)", claims[name])[0] for name in ("held", "group")]
    tap.is_(ended, [1, 2], "the ungrouped and the group claim complete with their tokens")
    tap.is_(one(last, "SELECT count(*) FROM throttle.all_events WHERE state = 'done'")[0], 5,
            "from 0.3.0, nothing is lost: the done events are the one before and the four since")
    last.close()
    fresh.close()


if __name__ == "__main__":
    main()
