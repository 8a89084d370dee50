#include "pg/wait_events.hpp"

#include "pg/compat.hpp"

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

}  // namespace pg_throttle::pg
