#include "pg/fence.hpp"

namespace pg_throttle::pg {
namespace {

struct FenceShared {
    int64 last_token;  // changed with __atomic builtins
};
static_assert(std::is_trivially_copyable_v<FenceShared>);

FenceShared* fence = nullptr;

}  // namespace

Size fence_shmem_size() {
    return MAXALIGN(sizeof(FenceShared));
}

void fence_attach_shmem() {
    bool found = false;
    fence = static_cast<FenceShared*>(
        ShmemInitStruct("pg_throttle fence", sizeof(FenceShared), &found));
    if (!found) {
        fence->last_token = GetCurrentTimestamp();
    }
}

int64 fence_next() {
    return __atomic_add_fetch(&fence->last_token, 1, __ATOMIC_RELAXED);
}

}  // namespace pg_throttle::pg
