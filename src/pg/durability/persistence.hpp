// The registry across clean restarts: written at postmaster shutdown, read
// once at startup (the pg_stat_statements pattern). The file has a magic
// number, a format version and a CRC; it is written under a temporary name
// and renamed into place durably, and removed once read, so a later crash
// never brings back state older than what shared memory held.
#pragma once

namespace pg_throttle::pg {

// In shmem_startup_hook, in the postmaster: loads the file if there is one
// (a WARNING, not a failure, when it is damaged or from another version)
// and arranges for the registry to be written at shutdown.
void persistence_startup();

}  // namespace pg_throttle::pg
