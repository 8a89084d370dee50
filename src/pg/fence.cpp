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

namespace pg_throttle::pg {

int64 fence_last() {
    return __atomic_load_n(&fence->last_token, __ATOMIC_RELAXED);
}

void fence_raise_to(int64 token) {
    int64 seen = fence_last();
    while (seen < token && !__atomic_compare_exchange_n(&fence->last_token, &seen, token, true,
                                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

}  // namespace pg_throttle::pg
