#include "pg/queue/event_notify.hpp"

extern "C" {
#include "commands/async.h"
}

namespace pg_throttle::pg {

void notify_event(const char* queue, int64 id) {
    PreventCommandDuringRecovery("NOTIFY");
    Async_Notify(queue, psprintf(INT64_FORMAT, id));
}

}  // namespace pg_throttle::pg
