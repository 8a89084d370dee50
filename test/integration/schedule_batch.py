#!/usr/bin/python3
"""throttle.schedule_many, the batch form of schedule, with real sessions:

- a batch that meets a pending event another transaction has not committed
  yet waits for it, and then treats it as schedule would (replace, keep the
  earlier run_at, or leave it), or inserts when that transaction rolls back;
- many clients scheduling overlapping batches at once, each key in a
  different order: no deadlock, no error, at most one pending event per key,
  and every id a batch returns is the event of its key;
- every due event of a batch is announced on the queue's channel once;
- enqueued_by names the role that called it, not the extension's owner.
"""
import os
import random
import select
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from pgconn import connect, one  # noqa: E402
from queue_interleavings import timed  # noqa: E402
from tap import Tap  # noqa: E402

CLIENTS = 8
BATCHES = 40
KEYS = 300


def fresh(cur, queue):
    cur.execute("DELETE FROM throttle.event WHERE queue = %s", (queue,))


def batch_meets_uncommitted(tap, admin, queue, mode, then, want_run_in):
    """Another transaction schedules k2 and stays open; a batch of k1, k2, k3
    runs meanwhile; then that transaction commits or rolls back."""
    cur = admin.cursor()
    fresh(cur, queue)
    other = connect(autocommit=False)
    ocur = other.cursor()
    ocur.execute("SELECT throttle.schedule(%s, 'k2', now() + interval '1 hour', '{\"by\": \"other\"}')", (queue,))
    other_id = ocur.fetchone()[0]
    batcher = connect(options="-c statement_timeout=20s")
    result, _, thread = timed(
        batcher,
        "SELECT throttle.schedule_many(%s, ARRAY['k1', 'k2', 'k3'], "
        "ARRAY[now() + interval '2 hours', now() + interval '30 minutes', now()], "
        "ARRAY['{\"by\": \"batch\"}', '{\"by\": \"batch\"}', '{\"by\": \"batch\"}']::jsonb[], "
        "on_duplicate => %s)", (queue, mode), wait=1)
    waited = thread.is_alive()
    if then == "commit":
        other.commit()
    else:
        other.rollback()
    thread.join(timeout=30)
    ids = (result.get("rows") or [[None]])[0][0]
    rows = one(admin, "SELECT array_agg(id ORDER BY id), array_agg(payload->>'by' ORDER BY id), "
                      "round(extract(epoch FROM min(run_at) - now()) / 60) "
                      "FROM throttle.all_events WHERE queue = %s AND item_key = 'k2' AND state = 'pending'", (queue,))
    k2_id, k2_by, k2_run_in = rows
    want_by = "other" if then == "commit" and mode == "ignore" else "batch"
    tap.ok(waited and result.get("error") is None and ids is not None and len(k2_id) == 1
           and ids[1] == k2_id[0] and (then == "rollback" or k2_id[0] == other_id)
           and k2_by == [want_by] and k2_run_in == want_run_in,
           f"a batch ({mode}) meeting an uncommitted schedule of one of its keys waits, and after the "
           f"{then} leaves one pending event of the key, as schedule would",
           f"waited {waited}, error {result.get('error')}, ids {ids}, k2 events {k2_id} by {k2_by} "
           f"due in {k2_run_in} min (other's id {other_id})")
    total = one(admin, "SELECT count(*) FROM throttle.all_events WHERE queue = %s", (queue,))[0]
    tap.is_(total, 3, f"the batch ({mode}, {then}) leaves three events, one per key")
    other.close()
    batcher.close()


def racing_clients(tap, admin):
    """CLIENTS clients each schedule BATCHES batches of 50 random keys out of
    KEYS (keys repeated within a batch too), in random order and mode."""
    cur = admin.cursor()
    fresh(cur, "sb.race")
    returned = []
    errors = []

    def client(seed):
        rng = random.Random(seed)
        conn = connect()
        try:
            with conn.cursor() as c:
                for _ in range(BATCHES):
                    keys = [f"k{rng.randrange(KEYS)}" for _ in range(50)]
                    mode = rng.choice(["replace", "keep_earlier", "ignore"])
                    c.execute("SELECT throttle.schedule_many('sb.race', %s::text[], "
                              "array_fill(now() + interval '1 hour', ARRAY[%s]), on_duplicate => %s)",
                              (keys, len(keys), mode))
                    returned.extend(zip(keys, c.fetchone()[0]))
        except Exception as e:  # noqa: BLE001 - reported by the checks below
            errors.append(str(e))
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    tap.ok(not errors, f"{CLIENTS} clients scheduling overlapping batches at once: no deadlock, no error",
           f"{len(errors)} errors, the first: {errors[0].splitlines()[0]}" if errors else "")
    keys_of = dict(one(admin, "SELECT array_agg(ARRAY[id::text, item_key]) FROM throttle.all_events "
                              "WHERE queue = 'sb.race'")[0] or [])
    wrong = [(key, event_id) for key, event_id in returned if keys_of.get(str(event_id)) != key]
    tap.ok(returned and not wrong, "every id a batch returned is an event of its item_key",
           f"{len(wrong)} wrong, e.g. {wrong[:5]}")
    per_key = one(admin, "SELECT count(*), count(DISTINCT item_key), count(*) FILTER (WHERE state <> 'pending') "
                         "FROM throttle.all_events WHERE queue = 'sb.race'")
    tap.ok(per_key[0] == per_key[1] and per_key[2] == 0 and per_key[1] == len({k for k, _ in returned}),
           "one pending event per key scheduled, whatever the interleaving",
           f"events {per_key[0]}, keys {per_key[1]}, not pending {per_key[2]}")


def notifications(tap, admin):
    cur = admin.cursor()
    fresh(cur, "sb.notify")
    listener = connect()
    listener.cursor().execute('LISTEN "sb.notify"')
    ids = one(admin, "SELECT throttle.schedule_many('sb.notify', ARRAY['a', 'b', 'c', 'b'], "
                     "ARRAY[now(), now() + interval '1 hour', now() - interval '1 minute', now()])")[0]
    heard = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(heard) < 3:
        if select.select([listener], [], [], 0.5)[0]:
            listener.poll()
            while listener.notifies:
                heard.append(int(listener.notifies.pop(0).payload))
    time.sleep(0.3)
    listener.poll()
    heard.extend(int(n.payload) for n in listener.notifies)
    # a, c and b (moved to now by its second mention) are due: each heard once.
    tap.is_(sorted(heard), sorted({ids[0], ids[1], ids[2]}),
            "every due event of a batch is announced once on the queue's channel, with its id")
    listener.close()


def caller_recorded(tap, admin):
    cur = admin.cursor()
    fresh(cur, "sb.role")
    cur.execute("SELECT count(*) FROM pg_roles WHERE rolname = 'schedule_batch_role'")
    if cur.fetchone()[0] == 0:
        cur.execute("CREATE ROLE schedule_batch_role")
    conn = connect(application_name="billing")
    c = conn.cursor()
    c.execute("SET ROLE schedule_batch_role")
    c.execute("SELECT throttle.schedule_many('sb.role', ARRAY['x', 'y'], ARRAY[now(), now()])")
    tap.is_(one(admin, "SELECT array_agg(DISTINCT enqueued_by) FROM throttle.all_events WHERE queue = 'sb.role'")[0],
            ["schedule_batch_role (billing)"], "enqueued_by names the role that called schedule_many")
    conn.close()


def main():
    tap = Tap(13)
    admin = connect()
    # 1-8: a batch meets another transaction's uncommitted schedule of a key.
    batch_meets_uncommitted(tap, admin, "sb.replace", "replace", "commit", 30)
    batch_meets_uncommitted(tap, admin, "sb.keep", "keep_earlier", "commit", 30)
    batch_meets_uncommitted(tap, admin, "sb.ignore", "ignore", "commit", 60)
    batch_meets_uncommitted(tap, admin, "sb.rollback", "ignore", "rollback", 30)
    # 9-11: racing clients.
    racing_clients(tap, admin)
    # 12: notifications.
    notifications(tap, admin)
    # 13: the caller.
    caller_recorded(tap, admin)
    admin.close()
    tap.done()


if __name__ == "__main__":
    main()
