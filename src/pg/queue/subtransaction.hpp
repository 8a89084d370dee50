// A step run in a subtransaction of its own, for what must leave nothing
// behind when it is given up: a row lock, once taken, lasts until its
// (sub)transaction ends, so the only way to let go of rows locked for a
// claim that is then given up is to roll back the subtransaction that
// locked them.
#pragma once

#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

// Runs `step(arg)` in a new subtransaction: kept (committed into the calling
// transaction, with the rows it locked and changed) when the step returns
// true, rolled back when it returns false. When it raises, the
// subtransaction is rolled back and the error goes on to the caller. The
// step allocates in the caller's memory context; it runs statements through
// SPI inside the caller's SPI_connect (their SPI_tuptable is freed at a
// rollback). It keeps only trivially destructible objects alive where it
// may raise (PG_TRY is a sigsetjmp).
// When `absorb` is given and answers true for the error the step raised,
// the error is dropped and the call returns false, rolled back, instead of
// raising it; `absorb` may raise an error of its own.
bool run_in_subtransaction(bool (*step)(void* arg), void* arg,
                           bool (*absorb)(const ErrorData* error, void* arg) = nullptr);

}  // namespace pg_throttle::pg
