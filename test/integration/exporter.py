#!/usr/bin/python3
"""Monitoring: throttle.registry_metrics and throttle.queue_metrics, and the
real prometheus-postgres-exporter (Debian's) serving them from
monitoring/queries.yaml, as an ordinary role that is a member of pg_monitor.
Counters survive the reclaim of their entries; a waiter and each queue state
show up in /metrics with the values the views give.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one, sql_error  # noqa: E402
from polling import wait_until  # noqa: E402
from tap import Tap  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
QUERIES = os.path.join(ROOT, "monitoring", "queries.yaml")
EXPORTER = shutil.which("prometheus-postgres-exporter") or "/usr/bin/prometheus-postgres-exporter"
ROLE, PASSWORD = "throttle_exporter", "exporter-secret"


def run(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_metrics(text):
    """{(name, frozenset(labels)): value} for the pg_throttle_* series."""
    series = {}
    for line in text.splitlines():
        m = re.match(r'^(pg_throttle_\w+)(?:\{(.*)\})? (\S+)$', line)
        if not m:
            continue
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        series[(m.group(1), labels)] = float(m.group(3))
    return series


def value(series, metric, **labels):
    """The value of the one series `metric` whose labels include `labels`."""
    found = [v for (n, ls), v in series.items()
             if n == metric and set(labels.items()) <= set(ls)]
    return found[0] if len(found) == 1 else None


def scrape(url, deadline, process=None):
    last = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the exporter exited ({process.returncode}): "
                               f"{process.stdout.read().decode(errors='replace')}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except OSError as e:
            last = e
            time.sleep(0.2)
    raise RuntimeError(f"no answer from {url}: {last}")


def no_collectors():
    """--no-collector.NAME for each collector this exporter's version has (they differ
    between Debian releases: bgwriter in 0.11, stat_bgwriter later): only the custom
    queries of monitoring/queries.yaml are under test."""
    text = subprocess.run([EXPORTER, "--help"], capture_output=True, text=True)
    names = set(re.findall(r"--(?:\[no-\])?collector\.([a-z_]+)\b", text.stdout + text.stderr))
    return [f"--no-collector.{name}" for name in sorted(names)]


def registry_row(conn, kind):
    return one(conn, "SELECT entries, in_force, capacity, grants, denials, waiters "
                     "FROM throttle.registry_metrics WHERE kind = %s", (kind,))


def main():
    t = Tap(27)
    admin = connect()
    run(admin, f"DROP ROLE IF EXISTS {ROLE}")
    run(admin, f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}' IN ROLE pg_monitor")
    run(admin, "DROP ROLE IF EXISTS throttle_metrics_plain")
    run(admin, "CREATE ROLE throttle_metrics_plain LOGIN PASSWORD 'plain-secret'")

    # Privileges: the server-wide registry totals are for pg_monitor.
    plain = connect(user="throttle_metrics_plain", password="plain-secret")
    t.is_(sql_error(plain, "SELECT * FROM throttle.registry_metrics")[0], "42501",
          "an ordinary role may not read the server-wide registry_metrics (42501)")
    t.is_(sql_error(plain, "SELECT * FROM throttle.queue_metrics"), None,
          "an ordinary role reads queue_metrics, as it reads throttle.event")
    plain.close()
    monitor = connect(user=ROLE, password=PASSWORD)
    t.is_(sql_error(monitor, "SELECT * FROM throttle.registry_metrics"), None,
          "a member of pg_monitor reads registry_metrics")

    # Grants and denials, counted across the reclaim of their entries.
    base = {k: registry_row(admin, k) for k in ("resource", "bucket", "lock")}
    for _ in range(3):
        one(admin, "SELECT throttle.acquire('metrics:job', '1 hour')")   # 1 grant, 2 denials
    for _ in range(5):
        one(admin, "SELECT throttle.allow('metrics:api', 2, '1 hour')")  # 2 allowed, 3 denied
    after = registry_row(admin, "resource")
    t.is_((after[3] - base["resource"][3], after[4] - base["resource"][4]), (1, 2),
          "resource: 1 grant and 2 denials counted")
    bucket = registry_row(admin, "bucket")
    t.is_((bucket[3] - base["bucket"][3], bucket[4] - base["bucket"][4]), (2, 3),
          "bucket: 2 grants and 3 denials counted")
    t.ok(after[0] >= 1 and after[1] >= 1 and after[2] > 0,
         "resource entries held and in force, and the capacity", str(after))
    one(admin, "SELECT throttle.reset('metrics:job')")
    one(admin, "SELECT throttle.reset('metrics:api')")
    reset = registry_row(admin, "resource")
    t.is_((reset[0], reset[3], reset[4]), (after[0] - 1, after[3], after[4]),
          "a dropped resource leaves the entries but keeps its grants and denials")
    t.is_(registry_row(admin, "bucket")[3:5], bucket[3:5],
          "a dropped bucket keeps its grants and denials")

    # A wait counts its grant when it reserves its units; one cancelled in its
    # sleep gives the units back but never takes the counted grant back.
    before = registry_row(admin, "bucket")[3]
    one(admin, "SELECT throttle.take('metrics:wait', 1, '10 seconds')")
    sleeper = connect()
    run(sleeper, "SET statement_timeout = '300ms'")
    grants_seen = [registry_row(admin, "bucket")[3]]
    outcome = []
    cancelled = threading.Thread(target=lambda: outcome.append(sql_error(
        sleeper, "SELECT throttle.wait('metrics:wait', 1, '10 seconds', timeout => '1 minute')")))
    cancelled.start()
    while cancelled.is_alive():
        grants_seen.append(registry_row(admin, "bucket")[3])
        time.sleep(0.02)
    grants_seen.append(registry_row(admin, "bucket")[3])
    sleeper.close()
    t.ok(outcome and outcome[0] is not None and outcome[0][0] == "57014" and
         grants_seen == sorted(grants_seen) and grants_seen[-1] == before + 2,
         "a wait cancelled in its sleep (57014) stays counted: the grants never go down",
         repr((before, grants_seen, outcome)))
    started = time.monotonic()
    one(admin, "SELECT throttle.wait('metrics:wait2', 1, '1 second')")
    one(admin, "SELECT throttle.wait('metrics:wait2', 1, '1 second')")
    slept = time.monotonic() - started
    t.ok(registry_row(admin, "bucket")[3] == before + 4 and slept >= 0.9,
         f"a wait that slept ({slept:.2f} s) counts one grant", registry_row(admin, "bucket"))

    # A lock with a waiter.
    holder = connect()
    token = one(holder, "SELECT throttle.lock('metrics:lock', ttl => '1 minute')")[0]
    waiter = connect()
    waiting = threading.Thread(
        target=lambda: one(waiter, "SELECT throttle.lock('metrics:lock', wait => '30 seconds')"))
    waiting.start()
    wait_until(lambda: registry_row(admin, "lock")[5] >= 1, 10)
    t.is_(registry_row(admin, "lock")[5], 1, "a backend waiting for a lock is counted")

    # Queues: due, scheduled, claimed, claims whose lease ended, dead.
    run(admin, "SET pg_throttle.test_clock = '2030-01-01 12:00:00+00'")
    for i in range(3):
        one(admin, "SELECT throttle.schedule('metrics_q', %s, '2030-01-01 11:59:00+00')",
            (f"due-{i}",))
    one(admin, "SELECT throttle.schedule('metrics_q', 'later', '2030-01-01 13:00:00+00')")
    one(admin, "SELECT throttle.schedule('metrics_q', 'claimed', '2030-01-01 11:00:00+00')")
    one(admin, "SELECT throttle.schedule('metrics_q', 'dies', '2030-01-01 10:00:00+00',"
               " max_attempts => 1)")
    dying = one(admin, "SELECT id, claim_token FROM throttle.claim('metrics_q', 'w', '1 minute')")
    one(admin, "SELECT throttle.fail(ARRAY[%s]::bigint[], %s, 'boom')", dying)
    claimed = one(admin, "SELECT id FROM throttle.claim('metrics_q', 'w', '1 minute')")[0]
    run(admin, "SET pg_throttle.test_clock = '2030-01-01 12:00:30+00'")
    q = one(admin, "SELECT due, scheduled, claimed, claims_expired, dead, oldest_due_seconds "
                   "FROM throttle.queue_metrics WHERE queue = 'metrics_q'")
    t.is_(q[:5], (3, 1, 1, 0, 1), "queue_metrics: 3 due, 1 for later, 1 claimed, 1 dead")
    t.is_(q[5], 90.0, "the oldest due event is 90 s old")
    run(admin, "SET pg_throttle.test_clock = '2030-01-01 12:02:00+00'")
    t.is_(one(admin, "SELECT claims_expired FROM throttle.queue_metrics "
                     "WHERE queue = 'metrics_q'")[0], 1,
          "a claim whose lease ended is counted as expired")
    run(admin, "RESET pg_throttle.test_clock")
    del claimed
    # The exporter reads on the real clock: a queue of its own, due now.
    for i in range(2):
        one(admin, "SELECT throttle.schedule('metrics_live', %s, now() - interval '2 minutes')",
            (f"due-{i}",))
    one(admin, "SELECT throttle.schedule('metrics_live', 'later', now() + interval '1 hour')")
    one(admin, "SELECT throttle.schedule('metrics_live', 'claimed', now() - interval '1 hour')")
    one(admin, "SELECT count(*) FROM throttle.claim('metrics_live', 'w', '1 minute')")
    one(admin, "SELECT throttle.pause('metrics_live', 'tenant-a'), throttle.pause('metrics_paused')")

    # Usage against quotas: a role with a quota of its own holds an entry.
    run(admin, "ALTER ROLE throttle_metrics_plain SET pg_throttle.role_quota = 90")
    plain = connect(user="throttle_metrics_plain", password="plain-secret")
    one(admin, "SELECT throttle.reset('metrics:plain')")
    one(plain, "SELECT throttle.acquire('metrics:plain', '1 hour')")
    plain.close()

    # The real exporter, as the pg_monitor role, on loopback.
    port = free_port()
    host = os.environ.get("PGHOST", "localhost")
    dsn = (f"host={host} port={os.environ.get('PGPORT', '5432')} "
           f"dbname={os.environ.get('PGDATABASE', 'postgres')} user={ROLE} "
           f"password={PASSWORD} sslmode=disable")
    # lib/pq, which the exporter is built on, panics on libpq variables it
    # does not support (PGSYSCONFDIR, which pg_virtualenv sets): the DSN says
    # everything, so none goes to it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["DATA_SOURCE_NAME"] = dsn
    exporter = subprocess.Popen(
        [EXPORTER, f"--web.listen-address=127.0.0.1:{port}", f"--extend.query-path={QUERIES}",
         "--disable-default-metrics", "--disable-settings-metrics", *no_collectors()],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        text = scrape(url, time.monotonic() + 30, exporter)
        series = parse_metrics(text)
        t.ok(bool(series), "the exporter serves pg_throttle_* series",
             "\n".join(l for l in text.splitlines() if "error" in l or "pg_up" in l))
        scrape_error = re.search(r"^pg_exporter_last_scrape_error (\S+)$", text, re.M)
        t.is_(scrape_error and float(scrape_error.group(1)), 0.0,
              "the exporter ran every query without an error")
        resource = registry_row(admin, "resource")
        t.is_(value(series, "pg_throttle_registry_grants", kind="resource"), float(resource[3]),
              "pg_throttle_registry_grants{kind=resource} is the view's count")
        t.is_(value(series, "pg_throttle_registry_denials", kind="bucket"),
              float(registry_row(admin, "bucket")[4]),
              "pg_throttle_registry_denials{kind=bucket} is the view's count")
        t.is_(value(series, "pg_throttle_registry_waiters", kind="lock"), 1.0,
              "pg_throttle_registry_waiters{kind=lock} shows the waiter")
        t.is_(value(series, "pg_throttle_registry_capacity", kind="lock"),
              float(resource[2]), "pg_throttle_registry_capacity is max_entries")
        usage = one(admin, "SELECT entries, quota FROM throttle.usage "
                           "WHERE scope = 'role' AND name = 'throttle_metrics_plain'")
        t.is_([value(series, f"pg_throttle_usage_{c}", scope="role", name="throttle_metrics_plain")
               for c in ("entries", "quota")], [float(usage[0]), float(resource[2] * 90 // 100)],
              "pg_throttle_usage_{entries,quota}{scope=role}: the role's entries and its own quota "
              "(90%, not the exporter's 50%)")
        database = one(admin, "SELECT entries, quota FROM throttle.usage "
                              "WHERE scope = 'database' AND name = current_database()")
        t.is_([value(series, f"pg_throttle_usage_{c}", scope="database",
                     name=os.environ.get("PGDATABASE", "postgres")) for c in ("entries", "quota")],
              [float(database[0]), float(database[1])],
              "pg_throttle_usage_{entries,quota}{scope=database}: the database's")
        t.is_([value(series, f"pg_throttle_queue_{c}", queue="metrics_live") for c in
               ("due", "scheduled", "claimed", "dead")], [2.0, 1.0, 1.0, 0.0],
              "pg_throttle_queue_{due,scheduled,claimed,dead}{queue=metrics_live}")
        t.is_([value(series, f"pg_throttle_queue_{c}", queue=q) for q in ("metrics_live", "metrics_paused")
               for c in ("paused", "paused_groups")], [0.0, 1.0, 1.0, 0.0],
              "pg_throttle_queue_{paused,paused_groups}: a paused group, a paused queue without events")
        oldest = value(series, "pg_throttle_queue_oldest_due_seconds", queue="metrics_live")
        t.ok(oldest is not None and 120 <= oldest < 600,
             "pg_throttle_queue_oldest_due_seconds: the age of the oldest due event",
             str(oldest))
        # A counter keeps counting after its entry is dropped, in /metrics too.
        one(admin, "SELECT throttle.acquire('metrics:again', '1 hour')")
        one(admin, "SELECT throttle.reset('metrics:again')")
        series = parse_metrics(scrape(url, time.monotonic() + 30))
        t.is_(value(series, "pg_throttle_registry_grants", kind="resource"),
              float(resource[3] + 1), "the grant of a dropped entry stays in the counter")
    finally:
        try:
            os.killpg(exporter.pid, signal.SIGTERM)
            exporter.wait(timeout=10)
        except ProcessLookupError:
            pass  # it had exited
        except subprocess.TimeoutExpired:
            os.killpg(exporter.pid, signal.SIGKILL)
        one(holder, "SELECT throttle.unlock('metrics:lock', %s)", (token,))
        waiting.join(timeout=30)
    t.ok(not waiting.is_alive(), "the waiter got the lock once it was released")
    t.done()


if __name__ == "__main__":
    main()
