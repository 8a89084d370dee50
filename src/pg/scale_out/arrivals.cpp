#include "pg/scale_out/arrivals.hpp"

namespace pg_throttle::pg {
namespace {

// Shards of every database whose placement this node has seen since it
// started. Citus's default is 32 shards a table; a rebalance of thousands
// fits.
constexpr int kSlots = 8192;
constexpr const char* kTrancheName = "pg_throttle arrivals";

struct ArrivalSlot {
    Oid dbid;  // InvalidOid: free
    int64 shard_id;
    Oid relid;  // the shard's relation on this node
    core::Micros arrived_at;
};

struct ArrivalsShared {
    int32 used;
    ArrivalSlot slots[kSlots];
};
static_assert(std::is_trivially_copyable_v<ArrivalsShared>);

ArrivalsShared* shared = nullptr;
LWLock* lock = nullptr;

ArrivalSlot* find(Oid dbid, int64 shard_id) {
    for (int32 i = 0; i < shared->used; i++) {
        ArrivalSlot& slot = shared->slots[i];
        if (slot.dbid == dbid && slot.shard_id == shard_id) {
            return &slot;
        }
    }
    return nullptr;
}

}  // namespace

void arrivals_request_shmem() {
    RequestAddinShmemSpace(MAXALIGN(sizeof(ArrivalsShared)));
    RequestNamedLWLockTranche(kTrancheName, 1);
}

void arrivals_attach_shmem() {
    bool found = false;
    shared = static_cast<ArrivalsShared*>(
        ShmemInitStruct("pg_throttle arrivals", sizeof(ArrivalsShared), &found));
    if (!found) {
        shared->used = 0;
    }
    lock = &GetNamedLWLockTranche(kTrancheName)[0].lock;
}

std::optional<core::Micros> arrival_of(int64 shard_id, Oid relid) {
    std::optional<core::Micros> arrived_at;
    LWLockAcquire(lock, LW_SHARED);
    const ArrivalSlot* slot = find(MyDatabaseId, shard_id);
    if (slot != nullptr && slot->relid == relid) {
        arrived_at = slot->arrived_at;
    }
    LWLockRelease(lock);
    return arrived_at;
}

core::Micros arrival_note(int64 shard_id, Oid relid, core::Micros arrived_at) {
    bool full = false;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    ArrivalSlot* slot = find(MyDatabaseId, shard_id);
    if (slot != nullptr && slot->relid == relid) {
        arrived_at = slot->arrived_at;
    } else if (slot == nullptr && shared->used == kSlots) {
        full = true;
    } else {
        if (slot == nullptr) {
            slot = &shared->slots[shared->used++];
        }
        *slot = ArrivalSlot{MyDatabaseId, shard_id, relid, arrived_at};
    }
    LWLockRelease(lock);
    if (full) {
        ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY),
                        errmsg("pg_throttle cannot note more than %d shard placements", kSlots),
                        errhint("Restart the server to forget placements that have moved away.")));
    }
    return arrived_at;
}

}  // namespace pg_throttle::pg
