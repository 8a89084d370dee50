-- throttle.reset: an operator clears entries after an incident.
SET pg_throttle.test_clock = '2032-03-01 00:00:00+00';
SELECT throttle.acquire('rst.job', '1 day') AS granted, throttle.acquire('rst.job', '1 day') AS denied;
SELECT throttle.reset('rst.job') AS cleared;
SELECT throttle.acquire('rst.job', '1 day') AS granted_again;

-- One kind only: the bucket of the same name, not the resource.
SELECT allowed FROM throttle.take('rst.job', 1, '1 hour', 1);
SELECT allowed FROM throttle.take('rst.job', 1, '1 hour', 1);
SELECT throttle.reset('rst.job', 'bucket') AS cleared_bucket;
SELECT allowed, remaining FROM throttle.take('rst.job', 1, '1 hour', 1, 0) AS bucket_full_again;
SELECT throttle.acquire('rst.job', '1 day') AS resource_still_taken;

-- A held lock can be taken again, with a greater token.
SELECT throttle.lock('rst.lock', '1 hour') AS t1 \gset
SELECT throttle.reset('rst.lock', 'lock') AS cleared_lock;
SELECT throttle.lock('rst.lock', '1 hour') > :t1 AS retaken_with_greater_token;
SELECT throttle.unlock('rst.lock', :t1) AS old_token_is_stale;

SELECT throttle.reset('rst.nothing') AS nothing_to_clear;

-- The checkpoint of resources in force (the test clock's windows end after
-- the real clock's now, so rst.job is one of them).
SELECT throttle.checkpoint() >= 1 AS checkpoint_written;
SELECT throttle.reset('rst.job', 'queue');
-- A group's lease, kind group in throttle.status, is refused with the call
-- that ends it: the claimed rows would still hold the group.
SELECT throttle.schedule('rst.q', 'e1', '2032-03-01 00:00:00+00', group_key => 'cust:1') IS NOT NULL AS scheduled;
SELECT count(*) AS claimed FROM throttle.claim_group('rst.q', 'rst-worker');
SELECT throttle.reset(name, kind) FROM throttle.status WHERE kind = 'group';
SELECT throttle.reset('5/2:rst.q:cust:1', 'group');
SELECT throttle.reset('5:rst.q#00ff', 'group');
-- Only a name a lease can have names the call: "<bytes of queue>[/<slot>]:"
-- as group_lease.cpp writes it (digits, no leading zero, a queue of 1 to 63
-- bytes, a slot of 1 to 63), else the generic hint.
SELECT throttle.reset(' 2:q1:g', 'group');
SELECT throttle.reset('+2:q1:g', 'group');
SELECT throttle.reset('02:q1:g', 'group');
SELECT throttle.reset('2/-5:q1:g', 'group');
SELECT throttle.reset('2/99999999999999999999999:q1:g', 'group');
SELECT throttle.reset('2/0:q1:g', 'group');
SELECT throttle.reset('2/64:q1:g', 'group');
SELECT throttle.reset('0::g', 'group');
SELECT throttle.reset('64:' || repeat('q', 64) || ':g', 'group');
SELECT throttle.reset('2/63:q1:g', 'group');
SELECT throttle.reset('63:' || repeat('q', 63) || ':g', 'group');
-- A group_key may be empty (throttle.schedule takes ''): its lease is "3:abc:".
SELECT throttle.reset('3:abc:', 'group');
-- The name is checked first, as for the other kinds.
SELECT throttle.reset('', 'group');
SELECT throttle.reset(repeat('n', 201), 'group');
SELECT count(*) AS still_held FROM throttle.status WHERE kind = 'group';
SELECT throttle.release_group('rst.q', 'cust:1') AS released;
SELECT throttle.reset(NULL);

-- Not for everyone.
CREATE ROLE throttle_reset_user;
SET ROLE throttle_reset_user;
SELECT throttle.reset('rst.job');
SELECT throttle.checkpoint();
RESET ROLE;
DROP ROLE throttle_reset_user;
RESET pg_throttle.test_clock;
