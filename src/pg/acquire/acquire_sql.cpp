// throttle.acquire(resource text, every interval, holder text) RETURNS boolean
//
// At most one grant per interval per resource per database. A denial is
// decided under the partition's shared lock; only a grant writes.
#include "core/interval_gate.hpp"
#include "pg/server/arguments.hpp"
#include "pg/server/boundary.hpp"
#include "pg/server/catalog.hpp"
#include "pg/durability/checkpoint.hpp"
#include "pg/server/clock.hpp"
#include "pg/registry/holder.hpp"
#include "pg/registry/registry.hpp"
#include "pg/scale_out/placement.hpp"

namespace pg_throttle::pg {
namespace {

struct AcquireCall {
    core::Micros now;
    core::Micros every;
    const Holder* holder;
    bool granted;
};

// The window `call` is decided against. A resource born under the crash rule
// counts as granted at the restart for every caller's interval: the longest
// asked so far is stored, and this call's own counts too.
core::IntervalWindow window_of(const RegistryEntry& entry, const AcquireCall& call) {
    core::IntervalWindow window{entry.granted_at, entry.expires_at};
    if (entry.born) {
        window.expires_at =
            std::max(window.expires_at, core::saturating_add(entry.granted_at, call.every));
    }
    return window;
}

// After a crash, a resource nobody has asked for since the restart counts as
// granted at the restart, for the interval the caller gives.
void acquire_born(RegistryEntry* entry, core::Micros restart, void* ctx) {
    const auto* call = static_cast<const AcquireCall*>(ctx);
    entry->granted_at = restart;
    entry->expires_at = core::saturating_add(restart, call->every);
    strlcpy(entry->holder, "[unknown: granted before a crash]", sizeof entry->holder);
}

bool acquire_decide_shared(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<AcquireCall*>(ctx);
    if (!core::window_denies(window_of(*entry, *call), call->now)) {
        return false;  // a grant may be possible: decide under the exclusive lock
    }
    __atomic_fetch_add(&entry->denials, 1, __ATOMIC_RELAXED);
    call->granted = false;
    return true;
}

void acquire_apply_exclusive(RegistryEntry* entry, void* ctx) {
    auto* call = static_cast<AcquireCall*>(ctx);
    const core::IntervalWindow current = window_of(*entry, *call);
    const core::IntervalDecision decision = core::decide_interval(&current, call->now, call->every);
    call->granted = decision.granted;
    if (!decision.granted) {
        __atomic_fetch_add(&entry->denials, 1, __ATOMIC_RELAXED);
        // A born window grows to the longest interval asked.
        entry->expires_at = current.expires_at;
        return;
    }
    entry->born = false;
    entry->granted_at = decision.window.granted_at;
    entry->expires_at = decision.window.expires_at;
    checkpoint_note_resource_grant();
    __atomic_fetch_add(&entry->grants, 1, __ATOMIC_RELAXED);
    entry->holder_pid = MyProcPid;
    memcpy(entry->holder, call->holder->text, sizeof entry->holder);
}

constexpr EntryOp kAcquireOp{acquire_born, acquire_decide_shared, acquire_apply_exclusive};

Datum acquire(FunctionCallInfo fcinfo) {
    registry_require();
    require_not_null(fcinfo, 0, "resource");
    const text* resource = PG_GETARG_TEXT_PP(0);
    RegistryKey key;
    registry_make_key(EntryKind::kResource, VARDATA_ANY(resource), VARSIZE_ANY_EXHDR(resource),
                      "resource", &key);
    placement_enter(EntryKind::kResource, VARDATA_ANY(resource), VARSIZE_ANY_EXHDR(resource));
    const Interval declared = PG_ARGISNULL(1) ? declared_resource_interval(resource) : Interval{};
    const Interval* every_arg = PG_ARGISNULL(1) ? &declared : PG_GETARG_INTERVAL_P(1);
    const Holder holder = holder_from_argument(fcinfo, 2);

    AcquireCall call{clock_now(), positive_interval(every_arg, "every"), &holder, false};
    registry_apply(key, kAcquireOp, &call, placement_moved_in_at(key));
    PG_RETURN_BOOL(call.granted);
}

}  // namespace
}  // namespace pg_throttle::pg

PG_THROTTLE_SQL_FUNCTION(pg_throttle_acquire, pg_throttle::pg::acquire)
