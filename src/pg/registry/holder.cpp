#include "pg/registry/holder.hpp"

#include "pg/server/arguments.hpp"

#include <cstdio>

namespace pg_throttle::pg {

namespace {

// The caller's description, rebuilt only when application_name changes.
Holder cached_caller{};
char cached_application_name[NAMEDATALEN] = {};
bool cached = false;

void describe_caller(Holder* holder) {
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
    memcpy(holder->text, described, kept);
    holder->text[kept] = '\0';
}

}  // namespace

const Holder& caller_holder() {
    const char* app = application_name != nullptr ? application_name : "";
    if (!cached || strncmp(app, cached_application_name, sizeof cached_application_name) != 0) {
        describe_caller(&cached_caller);
        strlcpy(cached_application_name, app, sizeof cached_application_name);
        cached = true;
    }
    return cached_caller;
}

Holder holder_from_argument(FunctionCallInfo fcinfo, int n) {
    if (PG_ARGISNULL(n)) {
        return caller_holder();
    }
    Holder holder{};
    clip_text(PG_GETARG_TEXT_PP(n), core::kMaxHolderBytes, holder.text);
    return holder;
}

}  // namespace pg_throttle::pg
