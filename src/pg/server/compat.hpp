// Differences between PostgreSQL versions, in one place (PG_VERSION_NUM).
//
// Supported: 15, 16, 17 and 18. Every #if on PG_VERSION_NUM in the module is
// in this file; the rest of src/pg calls the compat_* functions below.
#pragma once

#include "pg/server/pg_headers.hpp"

extern "C" {
#include "replication/syncrep.h"
#include "replication/walsender_private.h"
}

#if PG_VERSION_NUM < 150000 || PG_VERSION_NUM >= 190000
#error "pg_throttle supports PostgreSQL 15, 16, 17 and 18"
#endif

namespace pg_throttle::pg {

// DecodeDateTime, which 16 gave a DateTimeErrorExtra argument. Returns 0 or a
// DTERR_* code; it never raises an error.
inline int compat_decode_datetime(char** field, int* ftype, int nf, int* dtype, pg_tm* tm,
                                  fsec_t* fsec, int* tzp) {
#if PG_VERSION_NUM >= 160000
    DateTimeErrorExtra extra{};
    return DecodeDateTime(field, ftype, nf, dtype, tm, fsec, tzp, &extra);
#else
    return DecodeDateTime(field, ftype, nf, dtype, tm, fsec, tzp);
#endif
}

// This backend's number among the regular backends, bgworkers and
// walsenders: 1 .. MaxBackends. 15 and 16 call it MyBackendId; 17 replaced
// it with MyProcNumber, the index of the backend's PGPROC, which is below
// MaxBackends for every process that runs SQL (auxiliary processes come
// after them in ProcGlobal->allProcs).
inline int compat_my_backend_slot() {
#if PG_VERSION_NUM >= 170000
    return MyProcNumber + 1;
#else
    return MyBackendId;
#endif
}

// The index of this backend's PGPROC in ProcGlobal->allProcs, to set its
// latch from another backend. 17 dropped PGPROC.pgprocno.
inline int compat_my_pgprocno() {
#if PG_VERSION_NUM >= 170000
    return MyProcNumber;
#else
    return MyProc->pgprocno;
#endif
}

// The running server's server_version_num, which may be a later minor
// release than the headers the module was built with (PG_VERSION_NUM).
inline int compat_server_version_num() {
    static int version = 0;  // read once
    if (version == 0) {
        const char* text = GetConfigOption("server_version_num", true, false);
        version = text != nullptr ? atoi(text) : PG_VERSION_NUM;
    }
    return version;
}

// The byte WalSndCtl keeps for "are there synchronous standbys", read as a
// byte: headers older than 15.13, 16.9 and 17.5 name it as a bool
// (sync_standbys_defined), newer ones as flags (sync_standbys_status), and
// a module built against the older headers may run on a newer server, which
// writes flags into it. core/sync_standbys.hpp decides what it means.
inline uint8 compat_sync_standbys_byte() {
    auto* ctl = reinterpret_cast<volatile WalSndCtlData*>(WalSndCtl);
#if (PG_VERSION_NUM >= 150013 && PG_VERSION_NUM < 160000) || \
    (PG_VERSION_NUM >= 160009 && PG_VERSION_NUM < 170000) || PG_VERSION_NUM >= 170005
    const volatile void* byte = &ctl->sync_standbys_status;
#else
    const volatile void* byte = &ctl->sync_standbys_defined;
#endif
    return *static_cast<const volatile uint8*>(byte);
}

// +1 for the interval 'infinity', -1 for '-infinity', 0 for a finite one.
// 17 added infinite intervals; before, every interval is finite.
inline int compat_interval_infinity(const Interval* interval) {
#if PG_VERSION_NUM >= 170000
    if (INTERVAL_IS_NOEND(interval)) {
        return 1;
    }
    if (INTERVAL_IS_NOBEGIN(interval)) {
        return -1;
    }
#else
    (void)interval;
#endif
    return 0;
}

// Memory for a GUC check hook's "extra", which guc.c releases: with free()
// up to 15, with guc_free() (a memory context of its own) from 16. Returns
// null when out of memory; never raises an error.
inline void* compat_guc_extra_alloc(size_t size) {
#if PG_VERSION_NUM >= 160000
    return guc_malloc(LOG, size);
#else
    return malloc(size);
#endif
}

// The wait event for a wait named `name`: a custom wait event of its own from
// 17 (WaitEventExtensionNew, shown in pg_stat_activity and pg_wait_events;
// it can raise an error), the one "Extension" event before.
inline uint32 compat_custom_wait_event(const char* name) {
#if PG_VERSION_NUM >= 170000
    return WaitEventExtensionNew(name);
#else
    (void)name;
    return PG_WAIT_EXTENSION;
#endif
}

}  // namespace pg_throttle::pg

// The module's magic block. 18 also records the module's name and version,
// which pg_get_loaded_modules() shows.
#ifndef PG_THROTTLE_VERSION
#error "PG_THROTTLE_VERSION (the control file's default_version) is set by the build"
#endif
#if PG_VERSION_NUM >= 180000
#define PG_THROTTLE_MODULE_MAGIC \
    PG_MODULE_MAGIC_EXT(.name = "pg_throttle", .version = PG_THROTTLE_VERSION)
#else
#define PG_THROTTLE_MODULE_MAGIC PG_MODULE_MAGIC
#endif
