// Wake-ups at the due time: pg_throttle NOTIFYs a queue's channel when one
// of its events falls due later than it was written (a run_at ahead, the end
// of a retry's backoff, the end of a claim's lease), so that workers which
// LISTEN claim it on time without polling (docs/queue.md, "Wake-ups").
//
// The processes (docs/design.md, "Wake-ups"):
// - the launcher, one per server, a background worker started once recovery
//   is finished (so a promotion starts it), connected to no database: it
//   starts the wakers;
// - a waker per database that has something ahead, a dynamic background
//   worker connected to it (NOTIFY goes out from the event's database
//   only): it sleeps until the next instant, then calls
//   throttle._announce_due(after, upto), which NOTIFYs what fell due in
//   (after, upto] and answers the next instant. Its first pass announces
//   everything due (after = -infinity): what fell due while the server was
//   down is announced as it comes back.
//
// The table is the truth; shared memory only hints. A slot per database
// holds two instants, read and lowered without a lock:
// - `hinted`: the lowest instant written by a transaction committed since
//   the waker last drained it (exchanged it for +infinity). Every write of
//   throttle.event passes the row trigger, which notes the instants it
//   writes that lie after the statement's start; the commit lowers
//   `hinted` with them, once the rows are visible.
// - `planned`: when the waker means to wake next. A commit whose instant
//   lies before it sets the waker's latch, or, when the database has no
//   waker, asks the launcher for one.
// The waker publishes `planned` and then looks at `hinted` again; a commit
// lowers `hinted` and then looks at `planned`: one of the two sees the
// other, so no instant is left without a pass. An instant at or before the
// waker's last pass (a transaction that committed after it) lowers the
// waker's `after` and is announced again with its neighbours: a NOTIFY
// twice costs a worker an empty claim, a NOTIFY never costs it a poll.
//
// Writes the trigger does not see (a table written with its triggers
// disabled, a prepared transaction committed elsewhere) are found by the
// waker's full pass, at the latest a minute later, if still ahead.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

void wakeups_define_guc();
void wakeups_request_shmem();
void wakeups_attach_shmem();
void wakeups_register_launcher();

// From the row trigger: this transaction wrote `instant` (a pending event's
// run_at, a claim's lease_until). Noted when it lies after the statement's
// start; reported when the transaction commits.
void wakeup_note(TimestampTz instant);

// Before a statement that needs `database` without other connections
// (DROP, RENAME, SET TABLESPACE, the template of CREATE DATABASE): its
// waker is asked to exit and none is started for 30 s, or until
// wakeups_release. After the statement: `dropped` frees the slot.
void wakeups_hold(Oid database);
void wakeups_release(Oid database, bool dropped);

// throttle._waker_start(): this database has the extension (again): a
// waker is wanted here once the transaction commits.
void wakeups_want_here();

// After COMMIT PREPARED: the instants it wrote are unknown here, so this
// database's waker passes from the beginning of time.
void wakeups_pass_from_the_start();

// After CREATE DATABASE `to` from the template `from`: a waker for `to`
// when `from` has had one (the copy has its events ahead).
void wakeups_want_copy(Oid from, Oid to);

}  // namespace pg_throttle::pg
