#include "pg/server/waiting.hpp"

#include "pg/server/compat.hpp"

extern "C" {
#include "libpq/libpq-be.h"
#include "libpq/libpq.h"
#include "tcop/tcopprot.h"
}

namespace pg_throttle::pg {
namespace {

// One per name and backend; 0 until registered.
uint32 lock_event = 0;
uint32 wait_event = 0;

uint32 registered(uint32* cached, const char* name) {
    if (*cached == 0) {
        *cached = compat_custom_wait_event(name);
    }
    return *cached;
}

}  // namespace

uint32 wait_event_lock() {
    return registered(&lock_event, "ThrottleLock");
}

uint32 wait_event_wait() {
    return registered(&wait_event, "ThrottleWait");
}

void raise_if_client_gone() {
    if (MyProcPort == nullptr || whereToSendOutput != DestRemote || pq_check_connection()) {
        return;
    }
    ereport(FATAL, (errcode(ERRCODE_CONNECTION_FAILURE),
                    errmsg("connection to client lost while waiting in pg_throttle")));
}

}  // namespace pg_throttle::pg
