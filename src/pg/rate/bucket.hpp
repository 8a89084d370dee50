// Token buckets in the registry: the arguments of throttle.take, allow and
// wait, and the GCRA decision applied to the bucket's entry.
#pragma once

#include "core/gcra.hpp"
#include "pg/server/catalog.hpp"
#include "pg/registry/registry.hpp"

namespace pg_throttle::pg {

struct BucketRequest {
    RegistryKey key;
    core::BucketShape shape;
    int64 per;  // microseconds
    int32 rate;
    int32 burst;
    int32 cost;
};

// From (key, rate, per, burst, cost) at argument positions 0..4; burst NULL
// means rate. Raises 22004 for other NULLs, 22023 for values out of range.
void bucket_request_from_arguments(FunctionCallInfo fcinfo, BucketRequest* request);

// From the key at position 0 and the cost at `cost_arg`, with the shape
// declared in throttle.bucket for the key (42704 when there is none).
void bucket_request_from_declaration(FunctionCallInfo fcinfo, int cost_arg, BucketRequest* request);

// For the queue bucket `name` (EntryKind::kQueueBucket: no throttle.take
// reaches it) with the shape `declared` in throttle.bucket, and `cost`.
void queue_bucket_request(const text* name, const DeclaredBucket& declared, int32 cost,
                          BucketRequest* request);

// For the entry `key` (a queue's kind: no throttle.take reaches it) with the
// shape `declared`, and `cost`.
void bucket_request_for_key(const RegistryKey& key, const DeclaredBucket& declared, int32 cost,
                            BucketRequest* request);

// Takes as many units as the bucket has now, at most `want` (> 0); how many
// it took, 0 when it is empty. Each unit taken counts as in throttle.take.
// Raises 22008 when taking them would move the TAT past the range.
int64 bucket_take_up_to(BucketRequest request, core::Micros now, int64 want);

// Decides `request` at `now`, reserving it when it passes within `max_wait`
// (0: only when it passes now; kNever: no limit). Raises 53200 when the
// registry is full, 22008 when the request would pass but its TAT would be
// past the range (core::GcraDecision::out_of_range).
core::GcraDecision bucket_reserve(const BucketRequest& request, core::Micros now,
                                  core::Micros max_wait);

// Gives back a reservation whose TAT was `reserved`, if it is still the latest.
// The reservation stays counted as a grant: counters never go back.
void bucket_give_back(const BucketRequest& request, core::Micros reserved);

}  // namespace pg_throttle::pg
