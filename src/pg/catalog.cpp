#include "pg/catalog.hpp"

#include "pg/kept_plan.hpp"

namespace pg_throttle::pg {
namespace {

// One kept plan per catalog query, prepared on first use in this backend.
KeptPlan resource_query{
    "SELECT every FROM throttle.resource WHERE name = $1", 1, {TEXTOID}, nullptr};
KeptPlan bucket_query{
    "SELECT rate, per, burst FROM throttle.bucket WHERE name = $1", 1, {TEXTOID}, nullptr};

// A queue's bucket and its groups' in one row (NULLs for what is not
// declared): one statement per claim.
KeptPlan queue_buckets_query{
    "SELECT qb.rate, qb.per, qb.burst, qb.name, gb.rate, gb.per, gb.burst"
    " FROM (SELECT $1::text AS queue) x"
    " LEFT JOIN (throttle.queue_bucket q JOIN throttle.bucket qb ON qb.name = q.bucket)"
    "   ON q.queue = x.queue"
    " LEFT JOIN (throttle.group_bucket g JOIN throttle.bucket gb ON gb.name = g.bucket)"
    "   ON g.queue = x.queue",
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

// The shape in columns first .. first + 2 (rate, per, burst); false when
// rate is NULL (nothing declared: an outer join found no row).
bool extract_shape(HeapTuple row, TupleDesc desc, int first, DeclaredBucket* bucket) {
    bool is_null = false;
    const Datum rate = SPI_getbinval(row, desc, first, &is_null);
    if (is_null) {
        return false;
    }
    bucket->rate = DatumGetInt32(rate);
    bucket->per = *DatumGetIntervalP(SPI_getbinval(row, desc, first + 1, &is_null));
    const Datum burst = SPI_getbinval(row, desc, first + 2, &bucket->burst_is_null);
    bucket->burst = bucket->burst_is_null ? 0 : DatumGetInt32(burst);
    return true;
}

void extract_bucket(HeapTuple row, TupleDesc desc, void* ctx) {
    extract_shape(row, desc, 1, static_cast<DeclaredBucket*>(ctx));
}

void extract_queue_buckets(HeapTuple row, TupleDesc desc, void* ctx) {
    auto* found = static_cast<QueueBuckets*>(ctx);
    found->queue_limited = extract_shape(row, desc, 1, &found->queue_bucket);
    found->groups_limited = extract_shape(row, desc, 5, &found->group_bucket);
    if (found->queue_limited) {
        bool is_null = false;
        const text* name = DatumGetTextPP(SPI_getbinval(row, desc, 4, &is_null));
        const size_t size = VARSIZE_ANY_EXHDR(name) + VARHDRSZ;
        found->queue_bucket_name = static_cast<text*>(SPI_palloc(size));  // outlives SPI
        SET_VARSIZE(found->queue_bucket_name, size);
        memcpy(VARDATA(found->queue_bucket_name), VARDATA_ANY(name), size - VARHDRSZ);
    }
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

QueueBuckets queue_buckets(const text* queue) {
    QueueBuckets found{};
    lookup(&queue_buckets_query, queue, extract_queue_buckets, &found);  // always one row
    return found;
}

}  // namespace pg_throttle::pg
