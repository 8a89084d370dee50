#include "pg/server/cron_text.hpp"

#include <string_view>

namespace pg_throttle::pg {

core::CronSpec cron_spec_from_text(const text* cron) {
    const std::string_view expression(VARDATA_ANY(cron), VARSIZE_ANY_EXHDR(cron));
    const core::CronParse parsed = core::parse_cron(expression);
    if (!parsed.ok) {
        const core::CronError& error = parsed.error;
        const int offset = static_cast<int>(error.offset);
        if (std::string_view(error.field) == "expression") {
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("invalid cron expression"),
                     errdetail("At byte offset %d: %s.", offset, error.message)));
        }
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("invalid cron expression"),
                        errdetail("The %s field, at byte offset %d: %s.", error.field, offset,
                                  error.message)));
    }
    return parsed.spec;
}

}  // namespace pg_throttle::pg
