#include "pg/holder.hpp"

#include "pg/arguments.hpp"

#include <cstdio>

namespace pg_throttle::pg {

Holder holder_from_argument(FunctionCallInfo fcinfo, int n) {
    Holder holder{};
    if (!PG_ARGISNULL(n)) {
        clip_text(PG_GETARG_TEXT_PP(n), core::kMaxHolderBytes, holder.text);
        return holder;
    }
    const char* app = (application_name != nullptr && application_name[0] != '\0')
                          ? application_name
                          : "[unnamed]";
    const char* client = (MyProcPort != nullptr && MyProcPort->remote_host != nullptr)
                             ? MyProcPort->remote_host
                             : "[background]";
    char described[256];
    std::snprintf(described, sizeof described, "%s pid=%d %s", app, MyProcPid, client);
    const int kept = pg_mbcliplen(described, static_cast<int>(strlen(described)),
                                  static_cast<int>(core::kMaxHolderBytes));
    memcpy(holder.text, described, kept);
    holder.text[kept] = '\0';
    return holder;
}

}  // namespace pg_throttle::pg
