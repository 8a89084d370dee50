// Differences between PostgreSQL versions, in one place (PG_VERSION_NUM).
#pragma once

#include "pg/pg_headers.hpp"

extern "C" {
#include "replication/syncrep.h"
#include "replication/walsender_private.h"
}

namespace pg_throttle::pg {

// Whether the walsenders wait for synchronous standbys. 15.13, 16.9 and 17.5
// turned WalSndCtl's sync_standbys_defined into flags, with an "initialised"
// bit; before the checkpointer has initialised them the setting decides.
inline bool compat_sync_standbys_defined() {
#if (PG_VERSION_NUM >= 150013 && PG_VERSION_NUM < 160000) || \
    (PG_VERSION_NUM >= 160009 && PG_VERSION_NUM < 170000) || PG_VERSION_NUM >= 170005
    const bits8 status = reinterpret_cast<volatile WalSndCtlData*>(WalSndCtl)->sync_standbys_status;
    if ((status & SYNC_STANDBY_INIT) != 0) {
        return (status & SYNC_STANDBY_DEFINED) != 0;
    }
    return SyncRepStandbyNames != nullptr && SyncRepStandbyNames[0] != '\0';
#else
    return reinterpret_cast<volatile WalSndCtlData*>(WalSndCtl)->sync_standbys_defined;
#endif
}

}  // namespace pg_throttle::pg
