#include "pg/server/catalog.hpp"

#include "pg/server/kept_plan.hpp"

namespace pg_throttle::pg {
namespace {

// One kept plan per catalog query, prepared on first use in this backend.
KeptPlan resource_query{
    "SELECT every FROM throttle.resource WHERE name = $1", 1, {TEXTOID}, nullptr};
KeptPlan bucket_query{
    "SELECT rate, per, burst FROM throttle.bucket WHERE name = $1", 1, {TEXTOID}, nullptr};

// A queue's bucket and its groups' in one row (NULLs for what is not
// declared): one statement per claim.
KeptPlan queue_buckets_query{"SELECT " PG_THROTTLE_QUEUE_BUCKET_COLUMNS
                             ", gb.rate, gb.per, gb.burst" PG_THROTTLE_QUEUE_BUCKET_FROM
                             " LEFT JOIN (throttle.group_bucket g JOIN throttle.bucket gb"
                             "            ON gb.name = g.bucket) ON g.queue = x.queue",
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
    text* name = nullptr;
    found->queue_limited = queue_bucket_in_row(row, desc, 1, &found->queue_bucket, &name);
    if (found->queue_limited) {
        found->queue_bucket_name = static_cast<text*>(SPI_palloc(VARSIZE(name)));  // outlives SPI
        memcpy(found->queue_bucket_name, name, VARSIZE(name));
    }
    found->groups_limited = extract_shape(row, desc, 5, &found->group_bucket);
}

[[noreturn]] void raise_undeclared(const char* what, const text* name, const char* hint) {
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT),
                    errmsg("%s \"%s\" is not declared", what, text_to_cstring(name)),
                    errhint("%s", hint)));
    pg_unreachable();
}

}  // namespace

bool queue_bucket_in_row(HeapTuple row, TupleDesc desc, int first, DeclaredBucket* bucket,
                         text** name) {
    if (!extract_shape(row, desc, first, bucket)) {
        return false;
    }
    bool is_null = false;
    *name = DatumGetTextPCopy(SPI_getbinval(row, desc, first + 3, &is_null));
    return true;
}

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
