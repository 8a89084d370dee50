"""The promises every fault must keep (a backend crash, a postmaster kill, a
standby promotion), checked the same way in each scenario. Names are prefixed
with `prefix`.

Before the fault: a resource granted for an hour, a bucket drained, a lease
taken, a session lock held. After it, every check runs twice: a rule that
holds for the first call after a fault and not for the second is broken.
- the resource is not granted again, nor is one nobody asked for before
  (it counts as granted at the restart), for `acquire` and a peek alike;
- the bucket is empty: take, allow, a peek and a wait agree;
- the lease is still held by its holder, with its token and expiry, and the
  holder can renew and release it with that token;
- the session lock died with its session, and a name nobody held is free,
  both at once; every token is above every token before.
"""
from pgconn import one


def grant_before(tap, conn, session_conn, prefix):
    """Grants a resource, drains a bucket, takes a lease (on `conn`) and a
    session lock (on `session_conn`, which the fault ends). Returns what the
    checks after the fault need."""
    tap.ok(one(conn, f"SELECT throttle.acquire('{prefix}.job', '1 hour')")[0],
           f"{prefix}: a resource is granted before")
    one(conn, f"SELECT * FROM throttle.take('{prefix}.bucket', 10, '1 minute', 10, 10)")
    lease = one(conn, f"SELECT throttle.lock('{prefix}.lease', ttl => '30 seconds')")[0]
    expires = one(conn, "SELECT expires_at FROM throttle.locks WHERE name = %s",
                  (f"{prefix}.lease",))[0]
    session = one(session_conn, f"SELECT throttle.lock('{prefix}.session')")[0]
    top = one(conn, "SELECT max(token) FROM throttle.locks")[0]
    return {"lease": lease, "expires": expires, "session": session, "top": top}


def check_after_fault(tap, conn, prefix, after, before):
    """Twelve checks, each made with two calls."""
    def twice(sql, params=None):
        return [one(conn, sql, params)[0] for _ in range(2)]

    tap.ok(twice(f"SELECT throttle.acquire('{prefix}.job', '1 hour')") == [False, False],
           f"after {after}, the resource is not granted again within its interval (two calls)")
    tap.ok(twice(f"SELECT throttle.acquire('{prefix}.unknown', '1 hour')") == [False, False],
           f"after {after}, a resource nobody asked for since counts as granted then (two calls)")
    tap.ok(twice(f"SELECT allowed FROM throttle.take('{prefix}.bucket', 10, '1 minute', 10)")
           == [False, False], f"after {after}, the bucket starts empty (two takes)")
    tap.ok(twice(f"SELECT throttle.allow('{prefix}.fresh-bucket', 10, '1 minute', 10)")
           == [False, False],
           f"after {after}, a bucket nobody used since starts empty too (two allows)")
    tap.ok(twice(f"SELECT remaining FROM throttle.take('{prefix}.other-bucket', 10, '1 minute', 10, 0)")
           == [0, 0], f"after {after}, a peek sees the same empty bucket (two peeks)")
    tap.ok(twice(f"SELECT throttle.wait('{prefix}.wait-bucket', 10, '1 minute', 10, 1, "
                 "timeout => '100 milliseconds')") == [False, False],
           f"after {after}, a wait agrees: nothing within 100 ms (two waits)")
    tap.ok(twice(f"SELECT throttle.lock('{prefix}.lease', ttl => '1 second') IS NULL")
           == [True, True], f"after {after}, the lease is not handed to a second holder (two calls)")
    row = one(conn, "SELECT token, expires_at FROM throttle.locks WHERE name = %s",
              (f"{prefix}.lease",))
    tap.ok(row is not None and row[0] == before["lease"] and row[1] == before["expires"],
           f"after {after}, the lease keeps its token and expiry", repr((row, before)))
    tap.ok(twice(f"SELECT throttle.renew('{prefix}.lease', %s, '30 seconds')", (before["lease"],))
           == [True, True], f"after {after}, its holder renews it with its token (two renews)")
    tokens = twice(f"SELECT throttle.lock('{prefix}.session', wait => '0')")
    tap.ok(tokens[0] is not None and tokens[1] is None,
           f"after {after}, the session lock died with its session: free at once", repr(tokens))
    never = twice(f"SELECT throttle.lock('{prefix}.never', ttl => '20 seconds')")
    tap.ok(never[0] is not None and never[1] is None and never[0] > before["top"],
           f"after {after}, a name nobody held is free at once, with a token above every earlier one",
           repr((never, before["top"])))
    released = one(conn, f"SELECT throttle.unlock('{prefix}.lease', %s)", (before["lease"],))[0]
    again = one(conn, f"SELECT throttle.lock('{prefix}.lease', ttl => '20 seconds')")[0]
    tap.ok(released and again is not None and again > before["lease"],
           f"after {after}, the holder releases it, and the next holder gets a greater token",
           repr((released, again)))
