'use strict';
const test = require('node:test');
const assert = require('node:assert');
const { schedule, scheduleMany, cancel, reschedule } = require('..');
const { connect, unique, one, rows } = require('../testkit/db');

let db;
test.before(async () => { db = await connect(); });
test.after(() => db.end());

test('schedule: the id as a string, the event as given', async () => {
  const queue = unique('nq.schedule');
  const runAt = new Date(Date.now() + 3600e3);
  const id = await schedule(db, queue, 'mail:1', {
    runAt, payload: { user: 42 }, groupKey: 'g1', maxAttempts: 3, priority: 7,
  });
  assert.strictEqual(typeof id, 'string');
  const ev = await one(db, `SELECT item_key, group_key, payload, max_attempts, priority, state,
                                   run_at = $2::timestamptz AS at FROM throttle.event WHERE id = $1`,
                       [id, runAt.toISOString()]);
  assert.deepStrictEqual(ev, { item_key: 'mail:1', group_key: 'g1', payload: { user: 42 }, max_attempts: 3,
                               priority: 7, state: 'pending', at: true });
  // Without runAt: due now; on_duplicate keep_earlier keeps the same event.
  const now = await schedule(db, queue, 'mail:2');
  assert.ok((await one(db, 'SELECT run_at <= now() AS due FROM throttle.event WHERE id = $1', [now])).due);
  const again = await schedule(db, queue, 'mail:1', { runAt: new Date(Date.now() + 7200e3), onDuplicate: 'keep_earlier' });
  assert.strictEqual(again, id);
  assert.ok((await one(db, 'SELECT run_at = $2::timestamptz AS same FROM throttle.event WHERE id = $1',
                       [id, runAt.toISOString()])).same);
  await assert.rejects(schedule(db, queue, 'x', { onDuplicate: 'merge' }), RangeError);
  await assert.rejects(schedule(db, queue, 'x', { groupKey: 'g', concurrencyKey: 'c' }), { code: '22023' });
});

test('scheduleMany: ids in the order of items, defaults per item', async () => {
  const queue = unique('nq.many');
  const later = new Date(Date.now() + 60e3);
  const ids = await scheduleMany(db, queue, [
    { itemKey: 'a', runAt: later, payload: { n: 1 }, groupKey: 'g' },
    { itemKey: 'b' },
    { itemKey: 'c', payload: [1, 2] },
    { itemKey: 'a', runAt: later, payload: { n: 2 } },
  ], { priority: 2 });
  assert.strictEqual(ids.length, 4);
  assert.strictEqual(ids[0], ids[3]);
  assert.ok(ids.every((i) => typeof i === 'string'));
  const got = await rows(db, `SELECT id, item_key, group_key, payload, priority, run_at <= now() AS due
                              FROM throttle.event WHERE queue = $1 ORDER BY item_key`, [queue]);
  assert.deepStrictEqual(got, [
    { id: ids[0], item_key: 'a', group_key: 'g', payload: { n: 2 }, priority: 2, due: false },
    { id: ids[1], item_key: 'b', group_key: null, payload: {}, priority: 2, due: true },
    { id: ids[2], item_key: 'c', group_key: null, payload: [1, 2], priority: 2, due: true },
  ]);
  assert.deepStrictEqual(await scheduleMany(db, queue, []), []);
});

test('cancel and reschedule: true for a pending event, false otherwise', async () => {
  const queue = unique('nq.cancel');
  const id = await schedule(db, queue, 'r:1', { runAt: new Date(Date.now() + 86400e3) });
  const to = new Date(Date.now() + 2 * 86400e3);
  assert.strictEqual(await reschedule(db, queue, 'r:1', to), true);
  assert.ok((await one(db, 'SELECT run_at = $2::timestamptz AS moved FROM throttle.event WHERE id = $1',
                       [id, to.toISOString()])).moved);
  assert.strictEqual(await reschedule(db, queue, 'r:404', to), false);
  assert.strictEqual(await reschedule(db, queue, 'r:1', null), true);   // null: now
  assert.ok((await one(db, 'SELECT run_at <= now() AS due FROM throttle.event WHERE id = $1', [id])).due);
  assert.strictEqual(await cancel(db, queue, 'r:1'), true);
  assert.strictEqual(await cancel(db, queue, 'r:1'), false);
  assert.deepStrictEqual(await one(db, 'SELECT state FROM throttle.event_history WHERE id = $1', [id]),
                         { state: 'cancelled' });
});
