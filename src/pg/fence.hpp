// Fence tokens: numbers that grow with every lock grant, whatever the name.
//
// One counter for the server, so tokens also grow within every database.
// Across restarts the counter starts from the real clock in microseconds
// (since 2000-01-01): above every token handed out before, as long as grants
// stayed below one per microsecond on average and the clock did not step
// back. A durable high-water mark replaces that assumption with the
// durability work.
#pragma once

#include "pg/pg_headers.hpp"

namespace pg_throttle::pg {

Size fence_shmem_size();
void fence_attach_shmem();

// The next token: strictly greater than every token returned before.
int64 fence_next();

// The last token handed out, and raising the counter to at least `token`
// (after a restart, from the saved state).
int64 fence_last();
void fence_raise_to(int64 token);

}  // namespace pg_throttle::pg
