"""The promises a lost registry must keep (after a crash, a postmaster kill
or a promotion), checked the same way in every scenario: names prefixed with
`prefix` are granted before, and none of them is granted again after."""
from pgconn import one


def grant_before(tap, conn, prefix):
    """Grants a resource, drains a bucket and leases a lock; returns the lease's token."""
    tap.ok(one(conn, f"SELECT throttle.acquire('{prefix}.job', '1 hour')")[0],
           f"{prefix}: a resource is granted before")
    one(conn, f"SELECT * FROM throttle.take('{prefix}.bucket', 10, '1 minute', 10, 10)")
    return one(conn, f"SELECT throttle.lock('{prefix}.lease', '10 seconds')")[0]


def check_nothing_granted_twice(tap, conn, prefix, after):
    """Four checks: resource, unknown resource, bucket, lease."""
    tap.ok(not one(conn, f"SELECT throttle.acquire('{prefix}.job', '1 hour')")[0],
           f"after {after}, the resource is not granted again within its interval")
    tap.ok(not one(conn, f"SELECT throttle.acquire('{prefix}.unknown', '1 hour')")[0],
           f"after {after}, a resource not known since counts as granted then")
    tap.ok(not one(conn, f"SELECT allowed FROM throttle.take('{prefix}.bucket', 10, '1 minute', 10)")[0],
           f"after {after}, the bucket allows no more than before (it starts empty)")
    tap.ok(one(conn, f"SELECT throttle.lock('{prefix}.lease', '10 seconds')")[0] is None,
           f"after {after}, the lease is not handed to a second holder")
