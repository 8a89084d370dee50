#include "pg/catalog.hpp"

#include "pg/kept_plan.hpp"

namespace pg_throttle::pg {
namespace {

// One kept plan per catalog query, prepared on first use in this backend.
KeptPlan resource_query{
    "SELECT every FROM throttle.resource WHERE name = $1", 1, {TEXTOID}, nullptr};
KeptPlan bucket_query{
    "SELECT rate, per, burst FROM throttle.bucket WHERE name = $1", 1, {TEXTOID}, nullptr};

KeptPlan queue_bucket_query{
    "SELECT b.rate, b.per, b.burst, b.name FROM throttle.queue_bucket q"
    " JOIN throttle.bucket b ON b.name = q.bucket WHERE q.queue = $1",
    1,
    {TEXTOID},
    nullptr};

KeptPlan group_bucket_query{
    "SELECT b.rate, b.per, b.burst, b.name FROM throttle.group_bucket g"
    " JOIN throttle.bucket b ON b.name = g.bucket WHERE g.queue = $1",
    1,
    {TEXTOID},
    nullptr};

// Runs `query` for `name`; on the row found, `extract` copies what it needs
// before SPI memory goes away. Returns whether a row was found.
bool lookup(KeptPlan* query, const text* name,
            void (*extract)(HeapTuple row, TupleDesc desc, void* ctx), void* ctx) {
    if (SPI_connect() != SPI_OK_CONNECT) {
        elog(ERROR, "SPI_connect failed");
    }
    Datum args[1] = {PointerGetDatum(name)};
    run_kept_plan(query, args, nullptr, SPI_OK_SELECT, 1);
    const bool found = SPI_processed == 1;
    if (found) {
        extract(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, ctx);
    }
    SPI_finish();
    return found;
}

void extract_interval(HeapTuple row, TupleDesc desc, void* ctx) {
    bool is_null = false;
    const Datum value = SPI_getbinval(row, desc, 1, &is_null);
    if (!is_null) {  // NOT NULL in the catalog
        *static_cast<Interval*>(ctx) = *DatumGetIntervalP(value);
    }
}

void extract_bucket(HeapTuple row, TupleDesc desc, void* ctx) {
    auto* bucket = static_cast<DeclaredBucket*>(ctx);
    bool is_null = false;
    bucket->rate = DatumGetInt32(SPI_getbinval(row, desc, 1, &is_null));
    bucket->per = *DatumGetIntervalP(SPI_getbinval(row, desc, 2, &is_null));
    const Datum burst = SPI_getbinval(row, desc, 3, &bucket->burst_is_null);
    bucket->burst = bucket->burst_is_null ? 0 : DatumGetInt32(burst);
}

struct QueueBucket {
    DeclaredBucket bucket;
    text* name;
};

void extract_queue_bucket(HeapTuple row, TupleDesc desc, void* ctx) {
    auto* found = static_cast<QueueBucket*>(ctx);
    extract_bucket(row, desc, &found->bucket);
    bool is_null = false;
    const text* name = DatumGetTextPP(SPI_getbinval(row, desc, 4, &is_null));
    const size_t size = VARSIZE_ANY_EXHDR(name) + VARHDRSZ;
    found->name = static_cast<text*>(SPI_palloc(size));  // outlives this SPI call
    SET_VARSIZE(found->name, size);
    memcpy(VARDATA(found->name), VARDATA_ANY(name), size - VARHDRSZ);
}

[[noreturn]] void raise_undeclared(const char* what, const text* name, const char* hint) {
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT),
                    errmsg("%s \"%s\" is not declared", what, text_to_cstring(name)),
                    errhint("%s", hint)));
    pg_unreachable();
}

}  // namespace

Interval declared_resource_interval(const text* resource) {
    Interval every{};
    if (!lookup(&resource_query, resource, extract_interval, &every)) {
        raise_undeclared("resource", resource,
                         "Pass the interval as \"every\", or declare it with INSERT INTO "
                         "throttle.resource (name, every) VALUES (...).");
    }
    return every;
}

DeclaredBucket declared_bucket(const text* key) {
    DeclaredBucket bucket{};
    if (!lookup(&bucket_query, key, extract_bucket, &bucket)) {
        raise_undeclared("bucket", key,
                         "Pass rate and per, or declare the bucket with INSERT INTO "
                         "throttle.bucket (name, rate, per, burst) VALUES (...).");
    }
    return bucket;
}

bool queue_bucket(const text* queue, text** name, DeclaredBucket* bucket) {
    QueueBucket found{};
    if (!lookup(&queue_bucket_query, queue, extract_queue_bucket, &found)) {
        return false;
    }
    *name = found.name;
    *bucket = found.bucket;
    return true;
}

bool group_bucket(const text* queue, DeclaredBucket* bucket) {
    QueueBucket found{};
    if (!lookup(&group_bucket_query, queue, extract_queue_bucket, &found)) {
        return false;
    }
    *bucket = found.bucket;
    return true;
}

}  // namespace pg_throttle::pg
