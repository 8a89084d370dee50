// Who holds an entry, as shown to operators.
#pragma once

#include "core/names.hpp"
#include "pg/server/pg_headers.hpp"

namespace pg_throttle::pg {

struct Holder {
    char text[core::kMaxHolderBytes + 1];
};

// This backend described as "<application_name> pid=<pid> <client address>".
const Holder& caller_holder();

// The holder argument `n` clipped to kMaxHolderBytes, or, when NULL, the
// caller described as "<application_name> pid=<pid> <client address>".
Holder holder_from_argument(FunctionCallInfo fcinfo, int n);

}  // namespace pg_throttle::pg
