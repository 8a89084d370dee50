'use strict';
// Helpers that put events on a queue and change pending ones: schedule, scheduleMany,
// cancel and reschedule. Each takes a pg Client or Pool (any object with query()); each
// statement is one transaction unless the caller's Client is inside BEGIN ... COMMIT, where
// the change is part of the caller's transaction.
//
// Event ids are bigint: they come back as strings (Number() is exact only to 2^53).

const { ensureVersion } = require('./version');
const { timestamp } = require('./util');

const ON_DUPLICATE = ['replace', 'keep_earlier', 'ignore'];

function jsonText(value, name) {
  const text = JSON.stringify(value === undefined ? {} : value);
  if (text === undefined) throw new TypeError(`${name} is not JSON`);
  return text;
}

function common(options) {
  const { maxAttempts = 5, priority = 0, onDuplicate = 'replace' } = options;
  if (!ON_DUPLICATE.includes(onDuplicate)) {
    throw new RangeError(`onDuplicate must be one of ${ON_DUPLICATE.join(', ')}, not ${onDuplicate}`);
  }
  return { maxAttempts, priority, onDuplicate };
}

// throttle.schedule: the event's id (a string). runAt: a Date or timestamp string; omitted or
// null: now (throttle.now(), which follows pg_throttle.test_clock).
async function schedule(db, queue, itemKey, options = {}) {
  const { runAt, payload, groupKey = null, concurrencyKey = null } = options;
  const { maxAttempts, priority, onDuplicate } = common(options);
  await ensureVersion(db);
  const { rows } = await db.query(
    'SELECT throttle.schedule($1, $2, coalesce($3::timestamptz, throttle.now()), $4::jsonb, ' +
    'group_key => $5, max_attempts => $6, priority => $7, on_duplicate => $8, ' +
    'concurrency_key => $9) AS id',
    [queue, itemKey, timestamp(runAt, 'runAt'), jsonText(payload, 'payload'), groupKey,
      maxAttempts, priority, onDuplicate, concurrencyKey]);
  return rows[0].id;
}

// throttle.schedule_many: one statement for a batch of events of one queue; items are
// { itemKey, runAt?, payload?, groupKey?, concurrencyKey? }. Returns the ids in the order of
// items (an itemKey named twice: its id twice).
async function scheduleMany(db, queue, items, options = {}) {
  if (!Array.isArray(items)) throw new TypeError('items must be an array');
  const { maxAttempts, priority, onDuplicate } = common(options);
  await ensureVersion(db);
  const keys = items.map((it) => it.itemKey);
  const runAts = items.map((it, i) => timestamp(it.runAt, `items[${i}].runAt`));
  const payloads = items.map((it, i) => jsonText(it.payload, `items[${i}].payload`));
  const groups = items.some((it) => it.groupKey != null) ? items.map((it) => it.groupKey ?? null) : null;
  const concs = items.some((it) => it.concurrencyKey != null)
    ? items.map((it) => it.concurrencyKey ?? null) : null;
  const { rows } = await db.query(
    'SELECT throttle.schedule_many($1, $2::text[], ' +
    '  ARRAY(SELECT coalesce(t, throttle.now()) FROM unnest($3::timestamptz[]) WITH ORDINALITY AS u(t, n) ' +
    '        ORDER BY n), ' +
    '  payloads => $4::jsonb[], group_keys => $5::text[], max_attempts => $6, priority => $7, ' +
    '  on_duplicate => $8, concurrency_keys => $9::text[]) AS ids',
    [queue, keys, runAts, payloads, groups, maxAttempts, priority, onDuplicate, concs]);
  return rows[0].ids;
}

// throttle.cancel: true when a pending event was cancelled; false otherwise (a claimed,
// finished or unknown key; the server's NOTICE says which).
async function cancel(db, queue, itemKey) {
  await ensureVersion(db);
  const { rows } = await db.query('SELECT throttle.cancel($1, $2) AS ok', [queue, itemKey]);
  return rows[0].ok;
}

// throttle.reschedule: true when the pending event was moved to runAt (null: now).
async function reschedule(db, queue, itemKey, runAt) {
  await ensureVersion(db);
  const { rows } = await db.query(
    'SELECT throttle.reschedule($1, $2, coalesce($3::timestamptz, throttle.now())) AS ok',
    [queue, itemKey, timestamp(runAt, 'runAt')]);
  return rows[0].ok;
}

module.exports = { schedule, scheduleMany, cancel, reschedule };
