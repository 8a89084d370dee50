// What follows the end of claimed events (complete, fail): the group leases
// of group claims left with nothing claimed are released at commit, and the
// events that the end lets go are NOTIFYed on their queue's channel. Natively,
// what PL/pgSQL throttle._release_groups did (0.1.0's; gone) and
// throttle._notify_successors does (release_group still calls it).
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// Of the groups of the ended events of the claim `token` (bigint; queues
// and group_keys text[], one element per ended event, group_key NULL for an
// ungrouped one), those where the claim holds nothing more: their group
// leases are released when the transaction commits, and their due events
// NOTIFYed. Inside SPI_connect.
//
// "Due" is as of the clock read by these functions, after the caller's
// waits for locks: an event that came due while the caller waited is
// NOTIFYed too.
void release_emptied_groups(Datum queues, Datum group_keys, Datum token);

// NOTIFYs the due pending runs of the ended events' item_keys (scheduled
// while they ran) and, when `concurrency_keys` is not 0, the oldest due
// event of each of their concurrency_keys (text[] each, one element per
// ended event). Inside SPI_connect.
void notify_successors(Datum queues, Datum item_keys, Datum concurrency_keys);

// Its second part alone: NOTIFYs the oldest due event of each of the
// ended events' concurrency_keys (text[], NULL for an event without one;
// complete finds the item_key runs with its move). Inside SPI_connect.
void notify_key_waiters(Datum queues, Datum concurrency_keys);

}  // namespace pg_throttle::pg
