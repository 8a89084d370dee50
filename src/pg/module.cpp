// Module load: GUCs and the shared-memory hooks.
// Headers that bring in src/core come before any PostgreSQL header.
#include "pg/durability/lease_journal.hpp"
#include "pg/durability/wal.hpp"
#include "pg/locks/lock_waiters.hpp"
#include "pg/locks/locks.hpp"
#include "pg/registry/registry.hpp"
#include "pg/queue/fair_cursors.hpp"
#include "pg/queue/no_key_writes.hpp"
#include "pg/queue/scan_floors.hpp"
#include "pg/queue/wakeups.hpp"
#include "pg/scale_out/arrivals.hpp"

#include "pg/server/clock.hpp"
#include "pg/server/compat.hpp"
#include "pg/durability/checkpoint.hpp"
#include "pg/durability/fence.hpp"
#include "pg/durability/state_file.hpp"
#include "pg/server/pg_headers.hpp"
#include "pg/registry/standby.hpp"

extern "C" {
#include "catalog/pg_authid.h"
#include "catalog/pg_database.h"
#include "commands/defrem.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/syscache.h"
}

extern "C" {
PG_THROTTLE_MODULE_MAGIC;
void _PG_init(void);
}

namespace {

shmem_request_hook_type previous_shmem_request = nullptr;
shmem_startup_hook_type previous_shmem_startup = nullptr;
ProcessUtility_hook_type previous_process_utility = nullptr;

// Whether the current role may run `statement` on `database` as far as
// PostgreSQL's own checks go (its owner, or a superuser; for a template, a
// role with CREATEDB and a template or its own database): a statement that
// will be refused sends no waker away.
bool may_take_alone(Oid database, bool as_template) {
    if (superuser()) {
        return true;
    }
    HeapTuple tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(database));
    if (!HeapTupleIsValid(tuple)) {
        return false;
    }
    const auto* db = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
    const bool owner = has_privs_of_role(GetUserId(), db->datdba);
    const bool is_template = db->datistemplate;
    ReleaseSysCache(tuple);
    if (!as_template) {
        return owner;
    }
    HeapTuple role = SearchSysCache1(AUTHOID, ObjectIdGetDatum(GetUserId()));
    if (!HeapTupleIsValid(role)) {
        return false;
    }
    const bool createdb = reinterpret_cast<Form_pg_authid>(GETSTRUCT(role))->rolcreatedb;
    ReleaseSysCache(role);
    return createdb && (is_template || owner);
}

// The database a statement needs without other connections (its waker's
// among them), or InvalidOid: DROP DATABASE, ALTER DATABASE ... RENAME or
// SET TABLESPACE, and the template of CREATE DATABASE; only when the role
// may run it.
Oid database_needed_alone(Node* statement) {
    const char* name = nullptr;
    bool as_template = false;
    if (IsA(statement, DropdbStmt)) {
        name = reinterpret_cast<DropdbStmt*>(statement)->dbname;
    } else if (IsA(statement, RenameStmt) &&
               reinterpret_cast<RenameStmt*>(statement)->renameType == OBJECT_DATABASE) {
        name = reinterpret_cast<RenameStmt*>(statement)->subname;
    } else if (IsA(statement, AlterDatabaseStmt)) {
        auto* alter = reinterpret_cast<AlterDatabaseStmt*>(statement);
        ListCell* cell = nullptr;
        foreach (cell, alter->options) {
            if (strcmp(static_cast<DefElem*>(lfirst(cell))->defname, "tablespace") == 0) {
                name = alter->dbname;
            }
        }
    } else if (IsA(statement, CreatedbStmt)) {
        name = "template1";
        as_template = true;
        ListCell* cell = nullptr;
        foreach (cell, reinterpret_cast<CreatedbStmt*>(statement)->options) {
            auto* option = static_cast<DefElem*>(lfirst(cell));
            if (strcmp(option->defname, "template") == 0 && option->arg != nullptr) {
                name = defGetString(option);
            }
        }
    }
    const Oid database = name == nullptr ? InvalidOid : get_database_oid(name, true);
    return database != InvalidOid && may_take_alone(database, as_template) ? database : InvalidOid;
}

bool is_commit_prepared(Node* statement) {
    return IsA(statement, TransactionStmt) &&
           reinterpret_cast<TransactionStmt*>(statement)->kind == TRANS_STMT_COMMIT_PREPARED;
}

void run_standard(PlannedStmt* pstmt, const char* query_string, bool read_only_tree,
                  ProcessUtilityContext context, ParamListInfo params, QueryEnvironment* query_env,
                  DestReceiver* dest, QueryCompletion* qc) {
    if (previous_process_utility != nullptr) {
        previous_process_utility(pstmt, query_string, read_only_tree, context, params, query_env,
                                 dest, qc);
    } else {
        standard_ProcessUtility(pstmt, query_string, read_only_tree, context, params, query_env,
                                dest, qc);
    }
}

// DISCARD ALL, which poolers send between clients, releases this session's
// locks as it releases advisory locks. After the command: a DISCARD ALL
// that fails (inside a transaction block) releases nothing. A statement
// that needs a database without other connections first sends its waker
// away (wakeups.hpp), and lets it come back when it ends, failed or not.
// COMMIT PREPARED asks for a pass from the start. Holds only trivially
// destructible objects: the standard processing may raise.
void on_process_utility(PlannedStmt* pstmt, const char* query_string, bool read_only_tree,
                        ProcessUtilityContext context, ParamListInfo params,
                        QueryEnvironment* query_env, DestReceiver* dest, QueryCompletion* qc) {
    Node* statement = pstmt->utilityStmt;
    const bool discard_all = IsA(statement, DiscardStmt) &&
                             reinterpret_cast<DiscardStmt*>(statement)->target == DISCARD_ALL;
    const Oid alone = database_needed_alone(statement);
    if (alone == InvalidOid) {
        run_standard(pstmt, query_string, read_only_tree, context, params, query_env, dest, qc);
    } else {
        pg_throttle::pg::wakeups_hold(alone);
        PG_TRY();
        { run_standard(pstmt, query_string, read_only_tree, context, params, query_env, dest, qc); }
        PG_CATCH();
        {
            pg_throttle::pg::wakeups_release(alone, false);  // it failed: the waker comes back
            PG_RE_THROW();
        }
        PG_END_TRY();
        pg_throttle::pg::wakeups_release(alone, IsA(statement, DropdbStmt));
        if (IsA(statement, CreatedbStmt)) {
            pg_throttle::pg::wakeups_want_copy(
                alone, get_database_oid(reinterpret_cast<CreatedbStmt*>(statement)->dbname, true));
        }
    }
    if (discard_all) {
        pg_throttle::pg::lock_release_session_locks();
    }
    if (is_commit_prepared(statement)) {
        pg_throttle::pg::wakeups_pass_from_the_start();
        pg_throttle::pg::no_key_writes_all_moved();
    }
}

void on_shmem_request() {
    if (previous_shmem_request != nullptr) {
        previous_shmem_request();
    }
    pg_throttle::pg::registry_request_shmem();
    pg_throttle::pg::fence_request_shmem();
    pg_throttle::pg::checkpoint_request_shmem();
    pg_throttle::pg::lease_journal_request_shmem();
    pg_throttle::pg::arrivals_request_shmem();
    pg_throttle::pg::scan_floors_request_shmem();
    pg_throttle::pg::fair_cursors_request_shmem();
    pg_throttle::pg::no_key_writes_request_shmem();
    pg_throttle::pg::wakeups_request_shmem();
    RequestAddinShmemSpace(pg_throttle::pg::waiters_shmem_size());
}

void on_shmem_startup() {
    if (previous_shmem_startup != nullptr) {
        previous_shmem_startup();
    }
    pg_throttle::pg::registry_attach_shmem();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    pg_throttle::pg::fence_attach_shmem();
    pg_throttle::pg::checkpoint_attach_shmem();
    pg_throttle::pg::lease_journal_attach_shmem();
    pg_throttle::pg::arrivals_attach_shmem();
    pg_throttle::pg::scan_floors_attach_shmem();
    pg_throttle::pg::fair_cursors_attach_shmem();
    pg_throttle::pg::no_key_writes_attach_shmem();
    pg_throttle::pg::wakeups_attach_shmem();
    pg_throttle::pg::waiters_attach_shmem();
    LWLockRelease(AddinShmemInitLock);
    pg_throttle::pg::persistence_startup();
}

}  // namespace

void _PG_init(void) {
    // Without preloading there is no shared memory: every function then
    // raises SQLSTATE 55000 (registry_require) instead of working half-way.
    if (!process_shared_preload_libraries_in_progress) {
        return;
    }
    pg_throttle::pg::registry_define_gucs();
    pg_throttle::pg::define_clock_guc();
    pg_throttle::pg::checkpoint_define_guc();
    pg_throttle::pg::standby_define_guc();
    pg_throttle::pg::wakeups_define_guc();
    MarkGUCPrefixReserved("pg_throttle");

    pg_throttle::pg::wal_register();
    pg_throttle::pg::checkpoint_register_worker();
    pg_throttle::pg::wakeups_register_launcher();

    previous_shmem_request = shmem_request_hook;
    shmem_request_hook = on_shmem_request;
    previous_shmem_startup = shmem_startup_hook;
    shmem_startup_hook = on_shmem_startup;
    previous_process_utility = ProcessUtility_hook;
    ProcessUtility_hook = on_process_utility;
}
