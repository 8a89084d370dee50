// Fence tokens: numbers that grow with every lock grant, whatever the name.
//
// One counter for the server, so tokens also grow within every database.
// Tokens are handed out only below a durable high-water mark, the limit,
// raised a block at a time (as sequences do): the new limit is written to
// WAL and flushed (and waited for by synchronous standbys) and written to
// the file pg_throttle.fence before any token under it is used. WAL carries
// it to standbys and through crash recovery (a custom WAL resource manager,
// whose redo raises the limit and the counter); the file keeps it across
// checkpoints, after which the WAL that carried it is no longer replayed.
// After a crash or a promotion the counter starts at the limit, above every
// token handed out before.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// shmem_request_hook / shmem_startup_hook halves.
void fence_request_shmem();
void fence_attach_shmem();

// In the postmaster at startup: reads the durable limit. `ran_before`:
// pg_throttle ran on this data directory before, so a missing file is
// treated as a damaged one (the clock, with a WARNING), never as a fresh
// cluster's.
void fence_startup(bool ran_before);

// After fence_startup, when the last token handed out is not known (a
// crash, no usable state file): the counter continues from the limit.
void fence_continue_from_limit();

// WAL redo of a raised limit (wal.cpp).
void fence_redo_limit(int64 limit);

// Whether any token may have been handed out on this data directory.
bool fence_tokens_were_issued();

// Makes sure that a block of tokens is durable ahead of the counter (and on
// the synchronous standbys). Call it with no LWLock held, before work that
// may hand out tokens; raises an error during recovery (a standby cannot
// write WAL) and when the wait for standbys is cancelled.
void fence_reserve_ahead();

// The most `past` may be in fence_advance_past: tokens keep room to grow
// (2^62, a hundred thousand years of a million grants a second).
constexpr int64 kFenceAdvanceMax = int64{1} << 62;

// Makes every later token greater than `past` (0 <= past <=
// kFenceAdvanceMax), durably: a limit above it is written to WAL, flushed,
// written to the file and waited for by the synchronous standbys before the
// counter moves, so a crash or a promotion also continues above it. Returns
// the floor: every later token is greater. Call it with no LWLock held, not
// during recovery; raises an error when the limit cannot be made durable or
// the wait for standbys is cancelled (the counter is then unchanged).
int64 fence_advance_past(int64 past);

// The next token, strictly greater than every token returned before; 0 when
// the durable block is used up (the caller reserves and tries again).
int64 fence_next();

// The last token handed out, and raising the counter to at least `token`
// (after a restart, from the saved state).
int64 fence_last();
void fence_raise_to(int64 token);

// Raises a 64-bit counter in shared memory to at least `to`, without a lock
// (the fence counter and limit, the lease journal's sequence).
inline void atomic_raise(int64* value, int64 to) {
    int64 seen = __atomic_load_n(value, __ATOMIC_ACQUIRE);
    while (seen < to && !__atomic_compare_exchange_n(value, &seen, to, true, __ATOMIC_ACQ_REL,
                                                     __ATOMIC_ACQUIRE)) {
    }
}

}  // namespace pg_throttle::pg
