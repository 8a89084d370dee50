"""The HTTP contract both rate-limit examples keep (examples/python/ratelimit_server.py,
examples/node/ratelimit_server.js), checked the same way for each: statuses, the
RateLimit-* headers and Retry-After, from real requests."""
import json
import math
import time
import urllib.error
import urllib.request


def get(url, api_key=None):
    """A GET; (status, headers, body) for every status. Both servers answer JSON
    whatever the status: a body that is not JSON fails the test."""
    request = urllib.request.Request(url, headers={"X-Api-Key": api_key} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def limits(answer):
    """(status, RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset, Retry-After)."""
    status, headers, _ = answer
    return (status, headers.get("RateLimit-Limit"), headers.get("RateLimit-Remaining"),
            headers.get("RateLimit-Reset"), headers.get("Retry-After"))


def check_burst(tap, url, api_key):
    """Two checks on a server of rate 1 per 10 s, burst 3 (T = 10 s), with four requests
    of a key no one has used: they hold however slowly the requests come, within 10 s.
    Returns the four answers."""
    t0 = time.monotonic()
    answers = [get(url, api_key) for _ in range(4)]
    took = time.monotonic() - t0

    # The k-th take leaves the bucket full again 10 k s after the first take:
    # RateLimit-Reset is 10 k minus the time since the first take, rounded up.
    def reset_ok(value, k):
        return value is not None and 10 * k - math.ceil(took) <= int(value) <= 10 * k
    first = [limits(a) for a in answers[:3]]
    tap.ok([a[:3] + a[4:] for a in first] == [(200, "3", str(n), None) for n in (2, 1, 0)]
           and all(reset_ok(a[3], k) for k, a in enumerate(first, 1)),
           f"three 200s with RateLimit-Limit 3, RateLimit-Remaining 2, 1, 0 and RateLimit-Reset "
           f"10, 20, 30 s less the time taken ({took:.2f} s)", repr(first))
    # The 4th would pass 10 s after the first take: retry_after is 10 s less the
    # time since, and Retry-After that rounded up.
    denied, body = limits(answers[3]), answers[3][2]
    retry_after = int(denied[4]) if denied[4] else None
    tap.ok(denied[:3] == (429, "3", "0") and reset_ok(denied[3], 3) and retry_after is not None
           and 10 - math.ceil(took) <= retry_after <= 10
           and retry_after == max(1, math.ceil(body.get("retry_after_s", -1))),
           f"the 4th: 429 with Retry-After {retry_after}, retry_after ({body.get('retry_after_s')} s) "
           "rounded up", f"{denied} {body}")
    return answers


def check_wait_out(tap, url, api_key):
    """One check on a server of rate 1 per 2 s, burst 1, with a key no one has used:
    200, 429 with Retry-After, and 200 again after waiting it."""
    again = [get(url, api_key), get(url, api_key)]
    waited = again[1][1].get("Retry-After")
    if waited:
        time.sleep(int(waited))
    again.append(get(url, api_key))
    body = again[1][2]
    tap.ok([a[0] for a in again] == [200, 429, 200] and waited is not None
           and 1 <= int(waited) <= 2 and int(waited) == max(1, math.ceil(body.get("retry_after_s", -1))),
           f"rate 1 per 2 s, burst 1: 200, 429 with Retry-After {waited}, and 200 again after waiting it",
           repr([limits(a) for a in again]))
