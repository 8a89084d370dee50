"""The soak test's clients: processes that call pg_throttle over and over
through faults and log every answer, with the client's clock before the call
was sent (s) and after its answer came back (e), as JSON lines.

A grant whose connection dies has no answer: nothing is logged for it (a
grant nobody learned of promises nothing to anyone). A release (unlock,
complete) whose answer is lost is logged with its start and no answer: it may
have committed, and its holder stopped relying on the lease when it began to
release it. The client reconnects to whichever server is the primary now and
goes on.
"""
import json
import random
import time

import psycopg2

# The shapes the checker reads back (soak.py passes them on).
EVERY_S = 2.0                   # acquire's interval
RATE, PER_S, BURST = 20, 1, 5   # the bucket
LEASE_TTL_S = 2.0               # throttle.lock's leases
CLAIM_LEASE_S = 3.0             # claim_group's lease
RESOURCES = [f"soak.res.{i}" for i in range(3)]
LEASES = [f"soak.lease.{i}" for i in range(2)]
GROUPS = 6


def connect_primary(ports):
    """A connection to the server that is not in recovery, or None."""
    for port in ports:
        try:
            conn = psycopg2.connect(host="127.0.0.1", port=port, dbname="soak", user="postgres",
                                    connect_timeout=2,
                                    options="-c statement_timeout=5000")
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT pg_is_in_recovery()")
                if not cur.fetchone()[0]:
                    return conn
            conn.close()
        except psycopg2.Error:
            pass
    return None


def release_call(log, op, conn, sql, params, **fields):
    """call() for a release: logged with its start even when its answer is lost."""
    s = time.time()
    try:
        return call(conn, sql, params)
    except psycopg2.Error as e:
        log(op=op, s=s, e=None, answer_lost=str(e).splitlines()[0] if str(e) else repr(e),
            **fields)
        raise


def call(conn, sql, params=None):
    """(s, first column of the first row, e)."""
    s = time.time()
    with conn.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    return s, (row[0] if row else None), time.time()


class Client:
    def __init__(self, kind, index, ports, log_path, stop, produce):
        self.kind, self.index, self.ports = kind, index, ports
        self.log_file = open(log_path, "a", buffering=1)
        self.stop, self.produce = stop, produce
        self.conn = None
        self.rng = random.Random(f"{kind}-{index}")
        self.next_event = 0

    def log(self, **record):
        self.log_file.write(json.dumps(record) + "\n")

    def sleep(self, low, high):
        time.sleep(self.rng.uniform(low, high))

    def run(self):
        step = getattr(self, f"step_{self.kind}")
        while not self.stop.is_set():
            if self.conn is None:
                self.conn = connect_primary(self.ports)
                if self.conn is None:
                    time.sleep(0.2)
                    continue
            try:
                step()
            except psycopg2.Error as e:
                self.log(op="error", t=time.time(), error=str(e).splitlines()[0] if str(e) else repr(e))
                try:
                    if self.conn is not None:
                        self.conn.close()
                except psycopg2.Error:
                    pass
                self.conn = None
                time.sleep(0.1)

    # --- the workloads ------------------------------------------------------

    def step_acquire(self):
        name = self.rng.choice(RESOURCES)
        s, granted, e = call(self.conn, "SELECT throttle.acquire(%s, %s)", (name, f"{EVERY_S} seconds"))
        self.log(op="acquire", name=name, s=s, e=e, granted=granted)
        self.sleep(0.01, 0.05)

    def step_rate(self):
        if self.index == 0:  # one client blocks in throttle.wait
            s, ok, e = call(self.conn, "SELECT throttle.wait('soak.bucket', %s, %s, %s, 1, "
                                       "timeout => '1 second')", (RATE, f"{PER_S} second", BURST))
        else:
            s, ok, e = call(self.conn, "SELECT throttle.allow('soak.bucket', %s, %s, %s)",
                            (RATE, f"{PER_S} second", BURST))
        self.log(op="take", s=s, e=e, allowed=ok)
        self.sleep(0.0, 0.01)

    def step_lease(self):
        name = self.rng.choice(LEASES)
        s, token, e = call(self.conn, "SELECT throttle.lock(%s, ttl => %s, wait => '500 milliseconds')",
                           (name, f"{LEASE_TTL_S} seconds"))
        self.log(op="lock", name=name, s=s, e=e, token=token)
        if token is None:
            return
        self.sleep(0.0, 1.2)
        if self.rng.random() < 0.5:
            s, ok, e = call(self.conn, "SELECT throttle.renew(%s, %s, %s)",
                            (name, token, f"{LEASE_TTL_S} seconds"))
            self.log(op="renew", name=name, token=token, s=s, e=e, ok=ok)
            self.sleep(0.0, 0.8)
        if self.rng.random() < 0.8:
            s, ok, e = release_call(self.log, "unlock", self.conn,
                                    "SELECT throttle.unlock(%s, %s)", (name, token),
                                    name=name, token=token, ok=None)
            self.log(op="unlock", name=name, token=token, s=s, e=e, ok=ok)
        # else: the lease simply runs out

    def step_producer(self):
        if not self.produce.is_set():
            time.sleep(0.1)
            return
        key = f"ev-{self.index}-{self.next_event}"
        try:
            s, event_id, e = call(self.conn, "SELECT throttle.schedule('soak', %s, now(), %s, "
                                             "group_key => %s, max_attempts => 1000)",
                                  (key, json.dumps({"n": self.next_event}),
                                   f"g-{self.next_event % GROUPS}"))
        except psycopg2.Error:
            # No answer: whether it committed is read back once reconnected.
            self.conn = connect_primary(self.ports)
            if self.conn is None:
                raise
            _, found, _ = call(self.conn, "SELECT count(*) FROM throttle.all_events "
                                          "WHERE queue = 'soak' AND item_key = %s", (key,))
            if found == 0:
                return  # not scheduled: try the same key again
            event_id = None
            s = e = time.time()
        self.log(op="schedule", key=key, id=event_id, s=s, e=e)
        self.next_event += 1
        self.sleep(0.01, 0.04)

    def step_worker(self):
        worker = f"w{self.index}"
        s = time.time()
        with self.conn.cursor() as cur:
            cur.execute("SELECT id, group_key, claim_token FROM throttle.claim_group('soak', %s, %s)",
                        (worker, f"{CLAIM_LEASE_S} seconds"))
            rows = cur.fetchall()
        e = time.time()
        if not rows:
            time.sleep(0.05)
            return
        ids = [r[0] for r in rows]
        self.log(op="claim", worker=worker, group=rows[0][1], token=rows[0][2], ids=ids, s=s, e=e)
        self.sleep(0.0, 0.3)
        s, done, e = release_call(self.log, "complete", self.conn,
                                  "SELECT throttle.complete(%s, %s)", (ids, rows[0][2]),
                                  worker=worker, group=rows[0][1], token=rows[0][2], ids=ids,
                                  done=None)
        self.log(op="complete", worker=worker, group=rows[0][1], token=rows[0][2], ids=ids,
                 s=s, e=e, done=done)


def run_client(kind, index, ports, log_path, stop, produce):
    Client(kind, index, ports, log_path, stop, produce).run()
