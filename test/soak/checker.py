"""The soak test's checker: reads what the clients logged and finds every
broken promise that the logs prove.

Each logged call carries the client's clock just before it was sent (s) and
just after its answer came back (e); the server decided somewhere in
between. A violation is reported only when it holds for every possible
decision time inside those bounds, so a report is never a timing artefact,
and calls whose answer was lost (the connection died) promise nothing and
are left out. Client and server read the same machine's real-time clock.

Each check returns a list of violations (strings); empty means the promise held.
"""
from collections import defaultdict


def by_name(items, key=lambda item: item["name"]):
    grouped = defaultdict(list)
    for item in items:
        grouped[key(item)].append(item)
    return grouped


def resource_violations(grants, every):
    """At most one grant per `every` per resource: two grants of one name
    whose decision times are surely less than `every` apart.
    `grants`: dicts with name, s, e (granted calls only)."""
    found = []
    for name, calls in by_name(grants).items():
        calls.sort(key=lambda g: g["s"])
        for i, a in enumerate(calls):
            for b in calls[i + 1:]:
                if b["s"] - a["e"] >= every:
                    break  # sorted by s: later ones are further apart
                # |ga - gb| < every for every ga in [a.s, a.e], gb in [b.s, b.e]
                if max(b["e"] - a["s"], a["e"] - b["s"]) < every:
                    found.append(f"resource {name}: granted at [{a['s']:.6f}, {a['e']:.6f}] and "
                                 f"[{b['s']:.6f}, {b['e']:.6f}], less than {every} s apart")
    return found


def bucket_violations(grants, burst, emission):
    """Never more than burst + elapsed / emission grants in any window: for
    each window from one call's start to another's end, the grants surely
    inside it. `grants`: dicts with s, e (allowed calls of one bucket);
    `emission`: seconds per unit."""
    found = []
    by_start = sorted(grants, key=lambda g: g["s"])
    by_end = sorted(grants, key=lambda g: g["e"])
    for first in by_start:
        inside = 0
        for g in by_end:
            if g["s"] < first["s"]:
                continue
            inside += 1
            bound = burst + (g["e"] - first["s"]) / emission
            if inside > bound + 1e-9:
                found.append(f"bucket: {inside} grants within [{first['s']:.6f}, {g['e']:.6f}], "
                             f"more than {bound:.2f}")
                break
    return found


def holding_intervals(leases, ttl):
    """What each holder believed: from the grant's answer until it released
    the lease (the release's start) or the lease surely ended (the start of
    the grant or of its last successful renew, plus ttl), whichever is first.
    `leases`: dicts with name, token, s, e, and optionally renews (list of
    (s, e, ok)) and released (s of the unlock call)."""
    intervals = []
    for lease in leases:
        end = lease["s"] + ttl
        for s, _e, ok in lease.get("renews", []):
            if ok:
                end = max(end, s + ttl)
        if lease.get("released") is not None:
            end = min(end, lease["released"])
        intervals.append((lease["name"], lease["e"], end, lease))
    return intervals


def overlap_violations(intervals, what):
    """No two holders of one name at once. `intervals`: (name, begin, end, item)."""
    found = []
    for name, held in by_name([i for i in intervals if i[1] < i[2]], key=lambda i: i[0]).items():
        held = sorted(((begin, end, item) for _, begin, end, item in held), key=lambda h: h[0])
        latest_end = None
        latest = None
        for begin, end, item in held:
            if latest_end is not None and begin < latest_end:
                found.append(f"{what} {name}: held by {latest!r} until {latest_end:.6f} and by "
                             f"{item!r} from {begin:.6f}")
            if latest_end is None or end > latest_end:
                latest_end, latest = end, item
    return found


def token_violations(grants, what):
    """Fence tokens strictly increase per name: a grant surely after another
    (its call started after the other's answer) has a greater token.
    `grants`: dicts with name, token, s, e."""
    found = []
    for name, calls in by_name(grants).items():
        calls.sort(key=lambda g: g["e"])
        for i, a in enumerate(calls):
            for b in calls[i + 1:]:
                if b["s"] > a["e"] and b["token"] <= a["token"]:
                    found.append(f"{what} {name}: token {b['token']} granted after token {a['token']}")
    return found


def event_violations(scheduled, final_states):
    """Every scheduled event completed: `scheduled` item keys, `final_states`
    item key -> list of states of its rows."""
    found = []
    for key in sorted(scheduled):
        states = final_states.get(key)
        if not states:
            found.append(f"event {key}: lost (no row)")
        elif "done" not in states:
            found.append(f"event {key}: never done (states {states})")
    return found
