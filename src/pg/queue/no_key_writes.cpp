// Writes of events without a concurrency_key; see no_key_writes.hpp.
#include "pg/queue/no_key_writes.hpp"

namespace pg_throttle::pg {
namespace {

constexpr int kCounters = 256;

struct NoKeyWritesShared {
    pg_atomic_uint64 all;  // raised by every COMMIT PREPARED
    pg_atomic_uint64 counters[kCounters];
};

static_assert(std::is_trivially_copyable_v<NoKeyWritesShared>);

NoKeyWritesShared* shared = nullptr;

// This transaction's noted counters, a bit each.
uint64 noted[kCounters / 64];
bool any_noted = false;
bool callback_registered = false;

int counter_of(const text* queue) {
    // The database's part, once per backend (it stays in one database).
    static const uint32 seed = hash_bytes(reinterpret_cast<const unsigned char*>(&MyDatabaseId),
                                          static_cast<int>(sizeof(MyDatabaseId)));
    const uint64 hash =
        hash_bytes_extended(reinterpret_cast<const unsigned char*>(VARDATA_ANY(queue)),
                            static_cast<int>(VARSIZE_ANY_EXHDR(queue)), seed);
    return static_cast<int>(hash % kCounters);
}

// Nothing here raises: the commit has happened.
void on_transaction(XactEvent event, void* /*arg*/) {
    if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_PARALLEL_COMMIT &&
        event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT &&
        event != XACT_EVENT_PREPARE) {
        return;
    }
    // After the commit, whose rows are visible now; at PREPARE the rows
    // are not visible yet, and COMMIT PREPARED moves every count.
    if (any_noted && shared != nullptr &&
        (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT)) {
        for (int i = 0; i < kCounters; i++) {
            if ((noted[i / 64] & (uint64{1} << (i % 64))) != 0) {
                pg_atomic_fetch_add_u64(&shared->counters[i], 1);
            }
        }
    }
    memset(noted, 0, sizeof(noted));
    any_noted = false;
}

}  // namespace

void no_key_writes_request_shmem() {
    RequestAddinShmemSpace(MAXALIGN(sizeof(NoKeyWritesShared)));
}

void no_key_writes_attach_shmem() {
    bool found = false;
    shared = static_cast<NoKeyWritesShared*>(
        ShmemInitStruct("pg_throttle no-key writes", sizeof(NoKeyWritesShared), &found));
    if (!found) {
        pg_atomic_init_u64(&shared->all, 0);
        for (auto& counter : shared->counters) {
            pg_atomic_init_u64(&counter, 0);
        }
    }
}

void no_key_write_note(const text* queue) {
    if (shared == nullptr) {
        return;
    }
    if (!callback_registered) {
        RegisterXactCallback(on_transaction, nullptr);
        callback_registered = true;
    }
    const int i = counter_of(queue);
    noted[i / 64] |= uint64{1} << (i % 64);
    any_noted = true;
}

void no_key_writes_all_moved() {
    if (shared != nullptr) {
        pg_atomic_fetch_add_u64(&shared->all, 1);
    }
}

uint64 no_key_writes_count(const text* queue) {
    if (shared == nullptr) {
        return 0;
    }
    // A sum of two counters that only grow: it moves when either does.
    return pg_atomic_read_u64(&shared->all) +
           pg_atomic_read_u64(&shared->counters[counter_of(queue)]);
}

}  // namespace pg_throttle::pg
