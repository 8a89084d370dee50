// Whether the client of this backend is still there. A backend that sleeps
// in pg_throttle (throttle.wait, a lock's queue) reads nothing from its
// socket, so it would not notice its client leaving: it would then be handed
// a lease, or pass on units, for nobody.
#pragma once

namespace pg_throttle::pg {

// The longest a sleeping backend goes without looking at its client.
inline constexpr long kClientCheckMs = 1000;

// Raises FATAL (08006) when this backend's client has closed its connection,
// as PostgreSQL does with client_connection_check_interval. Backends with no
// client (background workers) never raise.
void raise_if_client_gone();

}  // namespace pg_throttle::pg
