#include "pg/client_connection.hpp"

#include "pg/pg_headers.hpp"

extern "C" {
#include "libpq/libpq-be.h"
#include "libpq/libpq.h"
#include "tcop/tcopprot.h"
}

namespace pg_throttle::pg {

void raise_if_client_gone() {
    if (MyProcPort == nullptr || whereToSendOutput != DestRemote || pq_check_connection()) {
        return;
    }
    ereport(FATAL, (errcode(ERRCODE_CONNECTION_FAILURE),
                    errmsg("connection to client lost while waiting in pg_throttle")));
}

}  // namespace pg_throttle::pg
