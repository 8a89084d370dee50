#!/usr/bin/python3
"""The least-privilege recipe of docs/security.md, run as written in a
database of its own, then checked as real roles: the application role
(app_rw) works, the monitoring role (monitoring) reads every view and can
call nothing that claims, cancels, reschedules or returns an event, and a
role granted neither is refused everything with 42501.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one, sql_error  # noqa: E402
from tap import Tap  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
DB = "pgt_least_privilege"
PASSWORD = "least-privilege-password"
MARK = "REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA throttle FROM PUBLIC"
VIEWS = ["status", "locks", "usage", "queue_metrics", "dead_events", "all_events", "attempt_history",
         "registry_metrics", "resource", "bucket", "queue_bucket", "group_bucket", "group_policy",
         "concurrency_policy"]
# What the monitoring role and an unrelated role may not do: claim, cancel,
# reschedule, return or change events, take from the registry.
FORBIDDEN = [
    "SELECT * FROM throttle.claim('lp', 'spy', '1 minute', 10)",
    "SELECT * FROM throttle.claim_group('lp.g', 'spy')",
    "SELECT throttle.cancel('lp', 'later')",
    "SELECT throttle.reschedule('lp', 'later', now())",
    "SELECT throttle.schedule('lp', 'spy', now())",
    "SELECT throttle.complete(ARRAY[1]::bigint[], 1)",
    "SELECT throttle.retry(1)",
    "SELECT * FROM throttle.retry_dead('lp')",
    "SELECT throttle.purge('0 seconds')",
    "SELECT throttle.acquire('lp.job', '1 hour')",
    "SELECT throttle.lock('lp.lock')",
    "SELECT payload FROM throttle.event",
    "SELECT claim_token FROM throttle.event",
]


def recipe():
    """The SQL block of docs/security.md that holds the recipe."""
    lines = open(os.path.join(ROOT, "docs", "security.md")).read().splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.strip() == "```sql" and MARK in "\n".join(lines[i:i + 5]))
    end = next(j for j in range(start + 1, len(lines)) if lines[j].strip() == "```")
    return "\n".join(lines[start + 1:end]) + "\n"


def as_role(role):
    return connect(user=role, password=PASSWORD, dbname=DB)


def code(conn, sql):
    err = sql_error(conn, sql)
    return err[0] if err else None


def main():
    tap = Tap(10)
    admin = connect()
    admin.cursor().execute(f"DROP DATABASE IF EXISTS {DB}")
    admin.cursor().execute(f"CREATE DATABASE {DB}")
    for role in ("app_rw", "monitoring", "pgt_lp_stranger"):
        if one(admin, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,))[0] == 0:
            admin.cursor().execute(f"CREATE ROLE {role} LOGIN")
        admin.cursor().execute(f"ALTER ROLE {role} LOGIN PASSWORD '{PASSWORD}'")
    db = connect(dbname=DB)
    db.cursor().execute("CREATE EXTENSION pg_throttle")
    db.cursor().execute("INSERT INTO throttle.bucket (name, rate, per) VALUES ('lp.api', 5, '1 minute')")

    done = subprocess.run(["psql", "-qX", "-v", "ON_ERROR_STOP=1", "-d", DB, "-f", "-"], input=recipe(),
                          capture_output=True, text=True)
    tap.is_(done.returncode, 0, "the recipe of docs/security.md runs as written" +
            (f": {done.stderr.strip()[:300]}" if done.returncode else ""))

    # The application: the registry, locks and the whole life of an event.
    app = as_role("app_rw")
    failed = []
    for sql in [
        "SELECT throttle.acquire('lp.job', '1 hour')",
        "SELECT * FROM throttle.take('lp.api')",
        "SELECT throttle.allow('lp.api')",
        "SELECT throttle.wait('lp.api', timeout => '1 second')",
        "SELECT throttle.allow('lp.inline', 5, '1 minute')",
        "SELECT throttle.schedule('lp', 'later', now() + interval '1 hour', '{\"secret\": 1}')",
        "SELECT throttle.reschedule('lp', 'later', now() + interval '2 hours')",
        "SELECT throttle.schedule('lp', 'gone', now() + interval '1 hour')",
        "SELECT throttle.cancel('lp', 'gone')",
        "SELECT throttle.schedule_many('lp', ARRAY['a', 'b'], ARRAY[now(), now()])",
        "SELECT throttle.schedule('lp', 'doomed', now(), max_attempts => 1)",
        "SELECT throttle.schedule('lp.g', 'g1', now(), group_key => 'g')",
    ]:
        err = sql_error(app, sql)
        if err:
            failed.append((sql, err))
    claimed = one(app, "SELECT array_agg(id ORDER BY item_key), min(claim_token) "
                       "FROM throttle.claim('lp', 'w', '1 minute', 10)")
    ids = dict(zip(["a", "b", "doomed"], claimed[0] or []))
    for sql, params in [
        ("SELECT throttle.extend(%s, %s, '2 minutes')", ([ids.get("a")], claimed[1])),
        ("SELECT throttle.complete(%s, %s)", ([ids.get("a")], claimed[1])),
        ("SELECT throttle.fail(%s, %s, 'boom')", ([ids.get("b"), ids.get("doomed")], claimed[1])),
        ("SELECT throttle.retry(%s::bigint)", (ids.get("doomed"),)),
        ("SELECT * FROM throttle.retry_dead('lp')", None),
        ("SELECT * FROM throttle.claim_group('lp.g', 'w')", None),
    ]:
        err = sql_error(app, sql, params)
        if err:
            failed.append((sql, err))
    token = one(app, "SELECT throttle.lock('lp.lock', '1 minute')")[0]
    tap.is_(failed, [], "the application role schedules, claims, extends, completes, fails, retries, "
                        "cancels and reschedules, and calls acquire, take, allow and wait")
    tap.is_(one(app, "SELECT token FROM throttle.locks WHERE name = 'lp.lock'")[0], token,
            "and takes a lock, whose token it sees in throttle.locks")

    # The monitoring role: every view, nothing else.
    monitor = as_role("monitoring")
    errors = {view: code(monitor, f"SELECT * FROM throttle.{view}") for view in VIEWS}
    tap.is_({v: c for v, c in errors.items() if c}, {}, "the monitoring role reads every view and "
            "declaration table: " + ", ".join(VIEWS))
    tap.is_(one(monitor, "SELECT (SELECT due + scheduled FROM throttle.queue_metrics WHERE queue = 'lp'),"
                         " (SELECT count(*) FROM throttle.dead_events),"
                         " (SELECT token FROM throttle.locks WHERE name = 'lp.lock'),"
                         " (SELECT count(*) > 0 FROM throttle.status WHERE name = 'lp.job')"),
            (3, 0, None, True),
            "with what they show: the queue's events, no dead event after retry_dead, the lock "
            "without its token, the application's resource")
    refused = {sql: code(monitor, sql) for sql in FORBIDDEN}
    tap.is_({s: c for s, c in refused.items() if c != "42501"}, {},
            "the monitoring role is refused (42501) every call that claims, cancels, reschedules, "
            "schedules, completes, retries, purges or takes, and payloads and tokens of throttle.event")
    tap.is_(code(monitor, f"SELECT throttle.unlock('lp.lock', {token})"), "42501",
            "and the application's lock, with its token")

    # A role granted neither.
    stranger = as_role("pgt_lp_stranger")
    refused = {sql: code(stranger, sql) for sql in [f"SELECT * FROM throttle.{v}" for v in VIEWS] + FORBIDDEN}
    tap.is_({s: c for s, c in refused.items() if c != "42501"}, {},
            "a role granted neither is refused (42501) every view, table and function")
    tap.is_(one(app, "SELECT throttle.unlock('lp.lock', %s)", (token,))[0], True,
            "the application releases its lock")
    tap.is_(sorted(r[0] for r in fetch(db, "SELECT state FROM throttle.all_events WHERE queue = 'lp'")),
            ["cancelled", "done", "pending", "pending", "pending"],
            "the events are where the application's calls put them")
    for conn in (app, monitor, stranger, db):
        conn.close()
    admin.cursor().execute(f"DROP DATABASE {DB}")
    admin.cursor().execute("DROP ROLE pgt_lp_stranger")
    admin.close()
    tap.done()


def fetch(conn, sql):
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


if __name__ == "__main__":
    main()
