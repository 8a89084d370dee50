// Per-key concurrency for throttle.claim (throttle.concurrency_policy): of
// the events of a queue that share a concurrency_key, at most max_claimed
// are claimed at once (claims whose lease holds), whichever workers hold
// them; 1 when the queue is not named in the policy.
//
// Exact under concurrency and after crashes, with nothing in shared memory:
//  - before it takes an event of key K, a claim takes K's key lock (an
//    advisory lock of pg_throttle's own class on a hash of the queue and K,
//    policy_lock.hpp) without waiting, and holds it until its transaction
//    ends. A claim that finds it held leaves K's events this time, as SKIP
//    LOCKED leaves rows.
//  - Holding it, the claim counts K's claims whose lease holds in the latest
//    snapshot: every claim of K that committed before is counted, and no
//    other is in progress. It takes at most max_claimed minus that many, and
//    lets the lock go at once when that is none.
//  - extend, the one other call that keeps a keyed claim alive, takes the
//    key lock too, shared (waiting for a claim in progress, not for other
//    extends), before it locks the claim's rows, and reads the clock after
//    both: it never revives a claim that a claim in progress counted as
//    ended. (This assumes the server's clock does not step back.)
//  - The count comes from the table, whose claims are durable
//    (durable_commit.hpp): after a crash, a claim whose lease holds still
//    counts until its lease ends.
// Two keys whose hashes collide share a lock: one claim leaves the other's
// events for a moment, never takes more. A claim takes events of at most
// kMaxKeysPerClaim keys (one lock each, from the server's lock table). A
// claim never waits: when a change of the policy holds or waits for the
// policy lock, it leaves every keyed event this time.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

inline constexpr int kMaxKeysPerClaim = 16;

struct KeyRoom {
    text* key;
    int32 room;   // events of key this claim may still take; 0: none
    int32 taken;  // events of key this claim has taken
};

// The keys one claim has met. Plain data in the claim's memory context.
struct ConcurrencyKeys {
    Datum queue;  // text
    TimestampTz now;
    bool policy_read;
    int32 max_claimed;  // 0 when the policy lock was not to be had
    int locked;         // key locks taken
    int count;
    int capacity;
    KeyRoom* keys;
};

// An expression (text[]) for the keys of queue $1 that the snapshot shows
// full at $2: max_claimed claims whose lease holds (found through
// event_claimed_concurrency). A claim's scans leave them without looking at
// their events; the key lock and the count make the rest exact.
#define PG_THROTTLE_FULL_CONCURRENCY_KEYS                                                    \
    "(SELECT coalesce(array_agg(f.concurrency_key), '{}') FROM ("                            \
    "  SELECT c.concurrency_key FROM throttle.event c"                                       \
    "  WHERE c.queue = $1 AND c.state = 'claimed' AND c.concurrency_key IS NOT NULL"         \
    "    AND c.lease_until > $2"                                                             \
    "  GROUP BY c.concurrency_key"                                                           \
    "  HAVING count(*) >= coalesce((SELECT p.max_claimed FROM throttle.concurrency_policy p" \
    "                               WHERE p.queue = $1), 1)) AS f)"

// The keys of a claim of `queue` at `now`, starting with `full` (the value
// of PG_THROTTLE_FULL_CONCURRENCY_KEYS), which take no more events.
ConcurrencyKeys concurrency_keys_start(Datum queue, TimestampTz now, ArrayType* full);

// The key lock of (`queue`, `key`): an advisory lock of pg_throttle's own
// class (policy_lock.hpp) on a hash of the two.
LOCKTAG concurrency_key_lock_tag(Datum queue, const text* key);

// Whether the claim may take one more event of `key` (which it then counts
// as taken): the first time it meets `key`, it takes the key lock and counts
// the key's claims (inside SPI_connect; SPI_tuptable is replaced).
bool concurrency_key_admit(ConcurrencyKeys* keys, const text* key);

// Whether the claim may take one more event of `key`, as admit would say,
// without counting one as taken: round robin asks before it reads the key's
// next event (the first time it meets `key`, it takes the key lock and
// counts the key's claims).
bool concurrency_key_has_room(ConcurrencyKeys* keys, const text* key);

// The claim found no event of `key` to take (round robin: none due, or all
// held back): when it has taken none of it, it lets the key's lock go and
// takes none of it from now on, so that keys with nothing due do not use
// up kMaxKeysPerClaim.
void concurrency_key_pass(ConcurrencyKeys* keys, const text* key);

// Whether the claim may still meet keys it has not met (it holds fewer
// than kMaxKeysPerClaim key locks, and no change of the policy held the
// policy lock).
bool concurrency_keys_may_meet_more(const ConcurrencyKeys& keys);

// The keys of which the claim takes no more events, as a text[].
ArrayType* concurrency_keys_full(const ConcurrencyKeys& keys);

// nullptr while the claim may still meet new keys; once it may not (it holds
// kMaxKeysPerClaim key locks, or a change of the policy holds the policy
// lock), the keys it may still take events of, as a text[] (maybe empty).
ArrayType* concurrency_keys_open(const ConcurrencyKeys& keys);

}  // namespace pg_throttle::pg
