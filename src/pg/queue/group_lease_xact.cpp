// The group leases this backend's open transaction took, and the releases
// it asked for, with the (sub)transaction each belongs to; see
// group_lease_xact.hpp for what happens to them at commit and rollback.
#include "pg/queue/group_lease_xact.hpp"

#include "pg/locks/locks.hpp"

namespace pg_throttle::pg {
namespace {

enum class Pending : uint8 { kTaken, kReleaseAtCommit };

struct PendingLease {
    RegistryKey key;
    int64 token;
    SubTransactionId subid;
    Pending what;
};
static_assert(std::is_trivially_copyable_v<PendingLease>);

// In TopMemoryContext, emptied at the end of every transaction.
PendingLease* pending = nullptr;
int pending_count = 0;
int pending_capacity = 0;
bool callbacks_registered = false;

// Removes entry i, keeping the others in order.
void drop(int i) {
    memmove(&pending[i], &pending[i + 1], sizeof(PendingLease) * (pending_count - i - 1));
    pending_count--;
}

// At the end of the transaction (InvalidSubTransactionId) or of the
// subtransaction `subid`: what it asked for ends. At a commit the releases
// asked for are done, at a rollback the leases taken are released; the rest
// is forgotten. Nothing here raises an error: the commit has happened.
void end(SubTransactionId subid, bool committed) {
    for (int i = 0; i < pending_count;) {
        if (subid != InvalidSubTransactionId && pending[i].subid != subid) {
            i++;
            continue;
        }
        const PendingLease lease = pending[i];
        drop(i);
        const Pending release = committed ? Pending::kReleaseAtCommit : Pending::kTaken;
        if (lease.what == release) {
            lock_release_at_transaction_end(lease.key, lease.token);
        }
    }
}

void on_transaction(XactEvent event, void* /*arg*/) {
    switch (event) {
        case XACT_EVENT_COMMIT:
        case XACT_EVENT_PARALLEL_COMMIT:
            end(InvalidSubTransactionId, true);
            break;
        case XACT_EVENT_ABORT:
        case XACT_EVENT_PARALLEL_ABORT:
            end(InvalidSubTransactionId, false);
            break;
        case XACT_EVENT_PREPARE:
            pending_count = 0;
            break;
        case XACT_EVENT_PRE_COMMIT:
        case XACT_EVENT_PARALLEL_PRE_COMMIT:
        case XACT_EVENT_PRE_PREPARE:
            break;
    }
}

void on_subtransaction(SubXactEvent event, SubTransactionId subid, SubTransactionId parent,
                       void* /*arg*/) {
    switch (event) {
        case SUBXACT_EVENT_ABORT_SUB:
            end(subid, false);
            break;
        case SUBXACT_EVENT_COMMIT_SUB:
            for (int i = 0; i < pending_count; i++) {
                if (pending[i].subid == subid) {
                    pending[i].subid = parent;
                }
            }
            break;
        case SUBXACT_EVENT_START_SUB:
        case SUBXACT_EVENT_PRE_COMMIT_SUB:
            break;
    }
}

void make_room() {
    if (!callbacks_registered) {
        RegisterXactCallback(on_transaction, nullptr);
        RegisterSubXactCallback(on_subtransaction, nullptr);
        callbacks_registered = true;
    }
    if (pending_count == pending_capacity) {
        const int capacity = pending_capacity == 0 ? 8 : pending_capacity * 2;
        const Size bytes = sizeof(PendingLease) * static_cast<Size>(capacity);
        pending = static_cast<PendingLease*>(pending == nullptr
                                                 ? MemoryContextAlloc(TopMemoryContext, bytes)
                                                 : repalloc(pending, bytes));
        pending_capacity = capacity;
    }
}

void remember(const RegistryKey& key, int64 token, Pending what) {
    make_room();
    pending[pending_count++] = PendingLease{key, token, GetCurrentSubTransactionId(), what};
}

}  // namespace

void group_lease_make_room() {
    make_room();
}

void group_lease_taken_in_transaction(const RegistryKey& key, int64 token) {
    remember(key, token, Pending::kTaken);
}

void group_lease_release_at_commit(const RegistryKey& key, int64 token) {
    remember(key, token, Pending::kReleaseAtCommit);
}

}  // namespace pg_throttle::pg
