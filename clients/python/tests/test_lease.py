"""pg_throttle.lease: a renewed lease with a fence token."""
import threading
import time

import psycopg
import pytest

import pg_throttle


def lock_row(conn, name):
    return conn.execute("SELECT token, expires_at > now() FROM throttle.locks WHERE name = %s",
                        (name,)).fetchone()


def test_lease_holds_and_unlocks(conn, name):
    with pg_throttle.lease("", name, 5, holder="pytest") as held:
        assert held.fence > 0 and held.token == held.fence and not held.lost.is_set()
        assert lock_row(conn, name) == (held.fence, True)
        with pytest.raises(pg_throttle.LockBusy):
            with pg_throttle.lease("", name, 5):
                pass
    assert lock_row(conn, name) is None
    # A connection given: its parameters open the lease's own connection.
    with pg_throttle.lease(conn, name, 5) as again:
        assert again.fence > held.fence


def test_two_holders_never_overlap(name):
    """Two threads take the lease in turn (waiting for it): the holds never
    overlap and each grant's fence is greater than the one before."""
    spans, lock = [], threading.Lock()
    errors = []

    def hold(n):
        try:
            for _ in range(5):
                with pg_throttle.lease("", name, 5, wait=10, holder=f"t{n}") as held:
                    start = time.monotonic()
                    time.sleep(0.02)
                    with lock:
                        spans.append((start, time.monotonic(), held.fence, n))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=hold, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    spans.sort()
    assert len(spans) == 10
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "two holders at once"
    assert all(a[2] < b[2] for a, b in zip(spans, spans[1:])), "fences do not increase"
    assert {s[3] for s in spans} == {0, 1}


def test_renewal_keeps_it_past_its_ttl(conn, name):
    with pg_throttle.lease("", name, 1.5) as held:      # renewed every 0.5 s
        time.sleep(3.5)
        assert not held.lost.is_set() and held.renewals >= 3
        assert lock_row(conn, name) == (held.fence, True)
        with pytest.raises(pg_throttle.LockBusy):
            with pg_throttle.lease("", name, 1):
                pass
        held.check()
    assert lock_row(conn, name) is None


def test_lost_is_flagged(conn, name):
    """An operator's reset takes the lock away: the next renewal fails, lost
    is set and check() raises; a new holder gets a greater fence."""
    with pg_throttle.lease("", name, 1.5) as held:
        assert conn.execute("SELECT throttle.reset(%s, 'lock')", (name,)).fetchone()[0] == 1
        with pg_throttle.lease("", name, 5) as other:
            assert other.fence > held.fence
            assert held.lost.wait(3)
            with pytest.raises(pg_throttle.LeaseLost):
                held.check()
        # Leaving a lost lease does not unlock what another holder may have.
    assert lock_row(conn, name) is None


def test_lease_errors(name):
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        with pg_throttle.lease("", "x" * 201, 5):
            pass
    with pytest.raises(TypeError):
        with pg_throttle.lease("", name, "5 seconds"):
            pass


@pytest.mark.parametrize("times", [{"ttl": 0}, {"ttl": -1}, {"ttl": 5, "renew_every": 0},
                                   {"ttl": 5, "renew_every": -1}, {"ttl": 5, "renew_every": 5},
                                   {"ttl": 5, "renew_every": float("nan")}])
def test_bad_times_are_refused_before_locking(name, times):
    """renew_every 0 would renew in a busy loop, and one not under the ttl
    would let the lease run out between renewals: refused before the lock is
    taken (none is left behind)."""
    ttl = times.pop("ttl")
    with pytest.raises(ValueError):
        with pg_throttle.lease("", name, ttl, **times):
            pass
    with psycopg.connect("", autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM throttle.locks WHERE name = %s", (name,)).fetchone()[0] == 0
