#!/usr/bin/python3
"""A promoted standby keeps every promise. It never had the primary's shared
memory: at its promotion, resources and buckets count as granted then. Leases
reach it through WAL (and its own lease journal, across its own restarts): the
primary's leases are still held by their holders after the promotion, with
their tokens and expiries, and fence tokens continue above every token the
primary handed out. A standby refuses acquire, take, allow and wait unless
the session asks for a standby-local decision, and the queue's functions. A
standby stopped and started as a primary without a promotion keeps the
promotion's rule from its start.

With synchronous standbys configured, a lease is not granted until they have
it, whatever the caller's synchronous_commit; a cancel ends the wait with an
error and no lease.

Builds a streaming standby of the cluster this suite runs against
(pg_basebackup), then stops the primary the hard way and promotes the
standby. Runs on a cluster of its own.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psycopg2

sys.path.insert(0, os.path.dirname(__file__))
from cluster import BIN, as_postgres, execute, pg_ctlcluster, reconnect  # noqa: E402
from crash_rules import check_after_fault, grant_before  # noqa: E402
from pgconn import connect, one  # noqa: E402
from tap import Tap  # noqa: E402

MAX_LEASE_S = 30


def error_code(conn, sql):
    try:
        one(conn, sql)
        return None
    except psycopg2.Error as e:
        return e.pgcode


def make_standby(primary, directory, port):
    """A hot standby of `primary` in `directory`, listening on `port`."""
    data = os.path.join(directory, "data")
    subprocess.run([f"{BIN}/pg_basebackup", "-D", data, "-R", "-X", "stream", "-c", "fast"],
                   check=True, capture_output=True, text=True)
    hba = one(primary, "SHOW hba_file")[0]
    shutil.copy(hba, os.path.join(data, "pg_hba.conf"))
    with open(os.path.join(data, "postgresql.conf"), "w") as f:
        f.write(f"""listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{directory}'
shared_preload_libraries = 'pg_throttle'
pg_throttle.max_lease = {MAX_LEASE_S}
hot_standby = on
""")
    subprocess.run(["chown", "-R", "postgres:postgres", directory], check=True)
    os.chmod(data, 0o700)
    pg_ctl(directory, "start")
    return data


def pg_ctl(directory, action, *extra):
    as_postgres(f"{BIN}/pg_ctl", "-D", os.path.join(directory, "data"), "-l",
                os.path.join(directory, "log"), "-w", action, *extra)


def wait_for_replay(primary, standby):
    target = one(primary, "SELECT pg_current_wal_flush_lsn()")[0]
    for _ in range(300):
        if one(standby, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))[0]:
            return True
        time.sleep(0.1)
    return False


def synchronous_standby(tap, primary, directory, port):
    """Lease grants wait for synchronous standbys, whatever the session asks."""
    execute(primary, "ALTER SYSTEM SET synchronous_standby_names = '*'")
    one(primary, "SELECT pg_reload_conf()")
    time.sleep(0.5)
    tap.ok(one(primary, "SELECT throttle.lock('sy.up', ttl => '10 seconds')")[0] is not None,
           "with a synchronous standby streaming, a lease is granted")
    pg_ctl(directory, "stop", "-m", "fast")
    impatient = connect()
    execute(impatient, "SET synchronous_commit = local")
    execute(impatient, "SET statement_timeout = '500ms'")
    started = time.time()
    code = error_code(impatient, "SELECT throttle.lock('sy.down', ttl => '10 seconds')")
    tap.ok(code == "57014" and time.time() - started >= 0.4,
           "with the synchronous standby gone, a lease waits for it even under "
           "synchronous_commit = local, and a cancel is an error (57014)", repr(code))
    tap.is_(one(primary, "SELECT count(*) FROM throttle.locks WHERE name = 'sy.down'")[0], 0,
            "and the lease was not granted")
    # Ended by pg_terminate_backend in that wait, which skips every error
    # handler: the lease nobody will be told of is released all the same.
    client = subprocess.Popen(["psql", "-X", "-q", "-c",
                               "SELECT throttle.lock('sy.term', ttl => '10 seconds')"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid = None
    for _ in range(100):
        row = one(primary, "SELECT pid FROM pg_stat_activity WHERE query LIKE '%sy.term%' "
                           "AND wait_event = 'SyncRep' AND pid <> pg_backend_pid()")
        if row:
            pid = row[0]
            break
        time.sleep(0.1)
    held = one(primary, "SELECT count(*) FROM throttle.locks WHERE name = 'sy.term'")[0]
    one(primary, "SELECT pg_terminate_backend(%s)", (pid,)) if pid else None
    client.wait()
    left = None
    for _ in range(100):
        left = one(primary, "SELECT count(*) FROM throttle.locks WHERE name = 'sy.term'")[0]
        if left == 0:
            break
        time.sleep(0.1)
    tap.ok(pid is not None and held == 1 and left == 0,
           "a lease whose grant waits for the synchronous standby, its backend terminated, is "
           "released", repr((pid, held, left)))
    pg_ctl(directory, "start")
    token = one(impatient, "SET statement_timeout = '30s'; "
                           "SELECT throttle.lock('sy.down', ttl => '10 seconds')")[0]
    tap.ok(token is not None, "once the standby is back, the lease is granted")
    impatient.close()
    execute(primary, "ALTER SYSTEM RESET synchronous_standby_names")
    one(primary, "SELECT pg_reload_conf()")


# Each call a standby must refuse, with what the refusal is about.
STANDBY_REFUSALS = [
    ("SELECT throttle.acquire('fo.sb', '1 minute')", "acquire"),
    ("SELECT throttle.acquire('fo.sb', '1 minute', 'x')", "acquire with a holder"),
    ("SELECT allowed FROM throttle.take('fo.sb', 1, '1 minute', 1)", "take"),
    ("SELECT allowed FROM throttle.take('fo.sb', 1, '1 minute', 1, 0)", "a peek"),
    ("SELECT throttle.allow('fo.sb', 1, '1 minute', 1)", "allow"),
    ("SELECT throttle.wait('fo.sb', 1, '1 minute', 1, 1, timeout => '1 second')", "wait"),
]
QUEUE_ON_STANDBY = [
    "SELECT throttle.schedule('fo.q', 'k', now())",
    "SELECT throttle.schedule_many('fo.q', ARRAY['a'], ARRAY[now()])",
    "SELECT throttle.cancel('fo.q', 'k')",
    "SELECT throttle.reschedule('fo.q', 'k', now())",
    "SELECT count(*) FROM throttle.claim('fo.q', 'w')",
    "SELECT count(*) FROM throttle.claim_group('fo.q', 'w')",
    "SELECT throttle.complete(ARRAY[1::bigint], 1)",
    "SELECT throttle.fail(ARRAY[1::bigint], 1, 'e')",
    "SELECT throttle.extend(ARRAY[1::bigint], 1, '1 minute')",
]


def refused_on_standby(tap, standby):
    """A standby's registry is its own: acquire, take, allow and wait refuse
    there (25006) unless the session asks for a standby-local decision; the
    queue's functions refuse with an error that says so."""
    codes = [(what, error_code(standby, sql)) for sql, what in STANDBY_REFUSALS]
    tap.ok(all(code == "25006" for _, code in codes),
           "a standby refuses acquire, take, a peek, allow and wait (25006)", repr(codes))
    try:
        one(standby, STANDBY_REFUSALS[0][0])
        message = ""
    except psycopg2.Error as e:
        message = (e.diag.message_primary or "") + " " + (e.diag.message_hint or "")
    tap.ok("standby" in message and "pg_throttle.standby_local" in message,
           "the error says why and names the setting that allows it", message)
    errors = []
    for sql in QUEUE_ON_STANDBY:
        try:
            one(standby, sql)
            errors.append((sql, None, ""))
        except psycopg2.Error as e:
            errors.append((sql, e.pgcode, e.diag.message_primary))
    tap.ok(all(code == "25006" for _, code, _ in errors),
           "every queue function refuses on a standby (25006)", repr(errors))
    tap.ok(all("standby" in msg or "read-only" in msg for _, _, msg in errors),
           "with a message that says it is a standby or read-only", repr(errors))


def restarted_as_primary(tap, primary, port):
    """A standby stopped cleanly and started again without standby.signal
    (not promoted) keeps the rule of a promotion: resources and buckets count
    as granted at its start, not at its shutdown, for the old primary may
    have granted meanwhile."""
    directory = tempfile.mkdtemp(prefix="pg_throttle_standby2.")
    try:
        make_standby(primary, directory, port)
        standby = reconnect(host="127.0.0.1", port=port)
        tap.ok(standby is not None and wait_for_replay(primary, standby),
               "a second standby runs and follows the primary")
        standby.close()
        pg_ctl(directory, "stop", "-m", "fast")
        stopped = time.time()
        time.sleep(6)
        # Granted by the old primary while the standby is down, for 10 s:
        # until about the shutdown + 16 s.
        granted = [one(primary, "SELECT throttle.acquire('sp.job', '10 seconds')")[0],
                   one(primary, "SELECT allowed FROM throttle.take('sp.bucket', 1, '10 seconds', 1)")[0]]
        os.unlink(os.path.join(directory, "data", "standby.signal"))
        pg_ctl(directory, "start")
        # Past the shutdown + 10 s (a rule from the shutdown would be over),
        # inside the old primary's grant (5 s of slack for the calls).
        time.sleep(max(0.0, 10.5 - (time.time() - stopped)))
        new = reconnect(host="127.0.0.1", port=port)
        answers = [one(new, "SELECT throttle.acquire('sp.job', '10 seconds')")[0] for _ in range(2)]
        takes = [one(new, "SELECT allowed FROM throttle.take('sp.bucket', 1, '10 seconds', 1)")[0]
                 for _ in range(2)]
        tap.ok(granted == [True, True] and answers == [False, False] and takes == [False, False],
               "started as a primary without a promotion, it counts resources and buckets as "
               "granted at its start, not at its shutdown (two calls each)",
               repr((granted, answers, takes, time.time() - stopped)))
        new.close()
        pg_ctl(directory, "restart", "-m", "fast")
        new = reconnect(host="127.0.0.1", port=port)
        answers = [one(new, "SELECT throttle.acquire('sp.other', '1 hour')")[0] for _ in range(2)]
        tap.ok(answers == [False, False],
               "and a clean restart keeps that rule (two calls)", repr(answers))
        new.close()
    finally:
        try:
            pg_ctl(directory, "stop", "-m", "immediate")
        except (subprocess.CalledProcessError, OSError):
            pass
        shutil.rmtree(directory, ignore_errors=True)


def main():
    tap = Tap(41)
    directory = tempfile.mkdtemp(prefix="pg_throttle_standby.")
    port = int(os.environ.get("PGPORT", "5432")) + 50
    try:
        run(tap, directory, port)
    finally:
        # Also when a step fails: a standby left running would hold its port
        # for the next run (the failover suite of the next version).
        try:
            pg_ctl(directory, "stop", "-m", "immediate")
        except (subprocess.CalledProcessError, OSError):
            pass  # not running
        shutil.rmtree(directory, ignore_errors=True)
    tap.done()


def run(tap, directory, port):
    primary = connect()
    one(primary, "CREATE EXTENSION IF NOT EXISTS pg_throttle; SELECT 1")
    # The backup is taken before the primary hands out any token, so the
    # standby's copy of the fence file knows none of them: only WAL tells it.
    restarted_as_primary(tap, primary, port + 1)
    make_standby(primary, directory, port)
    standby = reconnect(host="127.0.0.1", port=port)
    tap.ok(standby is not None, "the standby runs with pg_throttle preloaded")
    synchronous_standby(tap, primary, directory, port)

    tokens = [one(primary, "SELECT throttle.lock('fo.t%s', ttl => '10 seconds')" % i)[0]
              for i in range(20)]
    # Lease sequence numbers never go back, not even across clean restarts
    # of the primary after which no lease holds the highest: the standby
    # knows the name by its last number and would ignore lower ones.
    for _ in range(3):
        token = one(primary, "SELECT throttle.lock('fo.seq', ttl => '10 seconds')")[0]
        one(primary, "SELECT throttle.unlock('fo.seq', %s)", (token,))
    standby = reconnect(host="127.0.0.1", port=port)
    wait_for_replay(primary, standby)
    primary.close()
    for _ in range(2):  # the first start compacts the journal to the leases in force
        pg_ctlcluster("restart", "-m", "fast")
    primary = reconnect()
    seq_token = one(primary, "SELECT throttle.lock('fo.seq', ttl => '30 seconds')")[0]
    tap.ok(wait_for_replay(primary, standby), "the standby follows the restarted primary")
    tap.is_(one(standby, "SELECT token FROM throttle.locks WHERE name = 'fo.seq'"), (seq_token,),
            "a lease granted after the primary's clean restarts reaches the standby")
    holder = connect()
    before = grant_before(tap, primary, holder, "fo")
    kept = one(primary, "SELECT throttle.lock('fo.kept', ttl => '30 seconds')")[0]
    standby = reconnect(host="127.0.0.1", port=port)
    tap.ok(wait_for_replay(primary, standby), "the standby has replayed the primary's WAL")
    tap.is_(one(standby, "SELECT token FROM throttle.locks WHERE name = 'fo.lease'"), (before["lease"],),
            "the standby knows the primary's lease and its token")
    tap.is_(error_code(standby, "SELECT throttle.lock('fo.standby')"), "25006",
            "a standby refuses to hand out locks (25006)")
    tap.is_(error_code(standby, "SELECT throttle.renew('fo.lease', %d, '1 second')" % before["lease"]),
            "25006", "and to renew them (25006)")
    refused_on_standby(tap, standby)
    execute(standby, "SET pg_throttle.standby_local = on")
    tap.ok(one(standby, "SELECT throttle.acquire('fo.standby-only', '10 milliseconds')")[0],
           "asked explicitly (pg_throttle.standby_local), a standby decides from its own registry")
    execute(standby, "RESET pg_throttle.standby_local")
    # The standby restarts: its leases come back from its own lease journal.
    standby.close()
    pg_ctl(directory, "restart", "-m", "fast")
    standby = reconnect(host="127.0.0.1", port=port)
    tap.ok(wait_for_replay(primary, standby), "the standby restarted and caught up")
    tap.is_(one(standby, "SELECT token FROM throttle.locks WHERE name = 'fo.lease'"), (before["lease"],),
            "and still knows the lease, from its own lease journal")

    # The primary fails; the standby is promoted.
    pg_ctlcluster("stop", "-m", "immediate")
    primary.close()
    holder.close()
    tap.ok(one(standby, "SELECT pg_promote(true, 30)")[0], "the standby is promoted")
    check_after_fault(tap, standby, "fo", "the promotion", before)
    tap.ok(not one(standby, "SELECT throttle.acquire('fo.standby-only', '1 second')")[0],
           "what the standby granted before is forgotten: resources count as granted at the promotion")
    token = one(standby, "SELECT throttle.lock('fo.new', ttl => '10 seconds')")[0]
    tap.ok(token is not None and token > max(tokens + [before["top"], kept]),
           "fence tokens continue above every token the primary handed out", repr((token, kept)))
    log = open(os.path.join(directory, "log")).read()
    tap.ok("pg_throttle noticed the promotion" in log, "the log says the promotion was noticed")
    # A clean restart of the promoted server forgets nothing of the rule.
    standby.close()
    pg_ctl(directory, "restart", "-m", "fast")
    standby = reconnect(host="127.0.0.1", port=port)
    answers = [one(standby, "SELECT throttle.acquire('fo.after-restart', '1 hour')")[0]
               for _ in range(2)]
    tap.ok(answers == [False, False], "after a clean restart of the promoted server, a new "
           "resource still counts as granted at the promotion (two calls)", repr(answers))
    # A crash of the promoted server: its journal has the primary's leases.
    pid = one(standby, "SELECT pg_backend_pid()")[0]
    os.kill(pid, 9)
    standby.close()
    standby = reconnect(host="127.0.0.1", port=port)
    tap.is_(one(standby, "SELECT token FROM throttle.locks WHERE name = 'fo.kept'"), (kept,),
            "after a crash of the promoted server, a lease granted on the old primary is still held")
    standby.close()


if __name__ == "__main__":
    main()
