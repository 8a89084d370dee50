// The periodic checkpoint of the registry, which shrinks what a crash costs.
//
// A background worker writes the resources in force to pg_throttle.checkpoint
// every pg_throttle.checkpoint_interval (throttle.checkpoint() writes one at
// once). After a crash at K, restarted at R >= K, a resource the checkpoint
// (taken at C <= K) shows granted with a window still open at R cannot have
// been granted again in between: its window ran through K. Such resources
// come back exactly; only the others fall under the crash rule (granted at R).
// A resource still in the state an earlier crash rule gave it (born at R0,
// nothing granted since) is written as such and comes back as such: each call
// then decides on its own interval from R0, as before the crash, never on the
// window the calls before the checkpoint happened to ask for.
// A reset could break that reasoning, so throttle.reset (and a promotion)
// first deletes the checkpoint. Buckets and leases gain nothing from a
// checkpoint (a bucket may have been drained, a lease released and granted
// again after C), so only resources are written.
#pragma once

#include "core/time_math.hpp"
#include "pg/server/pg_headers.hpp"

extern "C" {
PGDLLEXPORT void pg_throttle_checkpointer_main(Datum arg);
}

namespace pg_throttle::pg {

// _PG_init: the GUC and the worker. shmem_request_hook / startup halves.
void checkpoint_define_guc();
void checkpoint_register_worker();
void checkpoint_request_shmem();
void checkpoint_attach_shmem();

// A resource was granted: the next checkpoint has something new to write.
// (One shared flag, written only when it changes: no contended store per call.)
void checkpoint_note_resource_grant();

// Writes a checkpoint now (no LWLock held). Returns the resources written.
// `only_if_changed`: skips it (-1) when no resource was granted since the last.
int64 checkpoint_write(bool only_if_changed);

// Around a change that a checkpoint must not outlive (throttle.reset):
// begin deletes the checkpoint (an error if it cannot) and keeps a new one
// from being moved into place; end refuses every checkpoint whose copy began
// before it. Nothing between them may raise an error.
void checkpoint_begin_forget();
void checkpoint_end_forget();

// In the postmaster after a crash: puts back the checkpoint's resources whose
// window is still open at `restart`. Returns how many.
int64 checkpoint_restore(core::Micros restart);

// In the postmaster at every start: removes the temporary files of writers
// that a crash or a shutdown cut short.
void checkpoint_remove_temporary_files();

// In the postmaster at the start of a standby or a restore from backup: a
// checkpoint copied with the base backup says nothing about the primary now.
void checkpoint_discard();

}  // namespace pg_throttle::pg
