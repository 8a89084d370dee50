'use strict';
// The worker under what goes wrong: bad values thrown by handlers, SQL errors of fail, a
// handler that ignores its signal at shutdown, a stalled connection, oversized delays and
// queue names.
const test = require('node:test');
const assert = require('node:assert');
const { Worker, schedule, scheduleMany } = require('..');
const { connect, unique, one, rows, waitFor } = require('../testkit/db');
const { stallProxy } = require('../testkit/stall_proxy');
const { useWorkers, sleep, settledWithin } = require('../testkit/workers');
const { childAfterFirstSigterm } = require('../testkit/signalled_child');

let db;
test.before(async () => { db = await connect(); });
test.after(() => db.end());
const makeWorker = useWorkers(test);
const eventRow = (id) => one(db, `SELECT state, attempts, last_error,
                                         round(extract(epoch FROM run_at - failed_at)) AS retry_s
                                  FROM throttle.all_events WHERE id = $1`, [id]);
const pendingAfterOneAttempt = async (queue) => (await one(db,
  `SELECT count(*)::int AS n FROM throttle.event WHERE queue = $1 AND state = 'pending' AND attempts = 1`, [queue])).n;

test('an error whose retryIn is negative, NaN or infinite: logged, the event failed with the worker\'s retryIn', async () => {
  const queue = unique('nf.retryin');
  const bad = [-1, NaN, Infinity, 'soon'];
  const ids = await scheduleMany(db, queue, bad.map((_, i) => ({ itemKey: `bad${i}`, payload: { i } })));
  const good = await schedule(db, queue, 'good');
  const w = makeWorker({ queue, retryIn: 600, max: 1, handler: async (e) => {
    if (e.item_key !== 'good') throw Object.assign(new Error('try later'), { retryIn: bad[e.payload.i] });
  } });
  await w.start();
  assert.ok(await waitFor(async () => w._fatal || (await pendingAfterOneAttempt(queue)) === bad.length, 5000));
  assert.ok(await waitFor(async () => w._fatal || (await eventRow(good)).state === 'done', 3000));
  assert.strictEqual(w._fatal, null, `the worker died: ${w.messages.join(' | ')}`);
  for (const id of ids) {
    assert.deepStrictEqual(await eventRow(id), { state: 'pending', attempts: 1, last_error: 'try later', retry_s: '600' });
  }
  assert.strictEqual(w.messages.filter((m) => /error\.retryIn must be .*; retrying after the worker's retryIn \(600 s\)/.test(m)).length,
                     bad.length, w.messages.join('\n'));
});

test('an error message with a NUL character: failed with U+FFFD in its place, the worker goes on', async () => {
  const queue = unique('nf.nul');
  const id = await schedule(db, queue, 'nul');
  const w = makeWorker({ queue, retryIn: 600, handler: async () => { throw new Error('bad byte \u0000 in a reply'); } });
  await w.start();
  // attempts is 1 from the claim on: wait for the end of that claim.
  assert.ok(await waitFor(async () => {
    const row = await eventRow(id);
    return w._fatal || (row.attempts === 1 && row.state !== 'claimed');
  }, 3000));
  assert.strictEqual(w._fatal, null, `the worker died: ${w.messages.join(' | ')}`);
  assert.deepStrictEqual(await eventRow(id), { state: 'pending', attempts: 1, last_error: 'bad byte \uFFFD in a reply', retry_s: '600' });
});

test('thrown values that are not Errors, Object.create(null) among them: each failed with a message', async () => {
  const queue = unique('nf.nonerror');
  const values = [undefined, null, 0, false, 'text', Symbol('sym'), { message: 42 }, Object.create(null)];
  const ids = await scheduleMany(db, queue, values.map((_, i) => ({ itemKey: `v${i}`, payload: { i } })));
  const w = makeWorker({ queue, retryIn: 3600, handler: async (e) => { throw values[e.payload.i]; } });
  await w.start();
  assert.ok(await waitFor(async () => w._fatal || (await pendingAfterOneAttempt(queue)) === ids.length, 5000));
  assert.strictEqual(w._fatal, null, `the worker died: ${w.messages.join(' | ')}`);
  const got = await rows(db, 'SELECT last_error FROM throttle.event WHERE queue = $1 ORDER BY id', [queue]);
  assert.deepStrictEqual(got.map((r) => r.last_error),
                         ['undefined', 'null', '0', 'false', 'text', 'Symbol(sym)', '42', '[object Object]']);
});

test('an SQL error of fail gives the claim up (logged, event lost) without stopping the worker', async () => {
  const queue = unique('nf.sqlerr');
  const [first, second] = await scheduleMany(db, queue, [{ itemKey: 'first' }, { itemKey: 'second', runAt: new Date(Date.now() + 500) }]);
  const w = makeWorker({ queue, handler: async (e) => { if (e.item_key === 'first') throw new Error('boom'); } });
  // The first fail raises on the server (22023: a negative retry_in), as a fail refused for
  // any reason would.
  let calls = 0;
  const orig = w._fail.bind(w);
  w._fail = (ids, token, message, retryIn) => (calls++ === 0 ? orig(ids, token, message, -1) : orig(ids, token, message, retryIn));
  const lost = [];
  const completed = [];
  w.on('lost', (l) => lost.push(l));
  w.on('completed', (e) => completed.push(e.id));
  await w.start();
  assert.ok(await waitFor(() => w._fatal || completed.includes(second), 5000), w.messages.join('\n'));
  assert.strictEqual(w._fatal, null, `the worker died: ${w.messages.join(' | ')}`);
  assert.strictEqual(lost.length, 1);
  assert.match(lost[0].reason, new RegExp(`^fail of ${first} raised 22023: `));
  assert.deepStrictEqual((await eventRow(first)).state, 'claimed');   // until its lease ends
});

test('stop({ abort: true }) with a handler that ignores its signal: returns after abortGrace, hands the event back, never completes it', async () => {
  const queue = unique('nf.hang');
  const id = await schedule(db, queue, 'hang');
  let release;
  let started;
  const startedP = new Promise((r) => { started = r; });
  const w = makeWorker({ queue, lease: 1.5, abortGrace: 0.5,
    handler: () => { started(); return new Promise((res) => { release = res; }); } });
  const completed = [];
  w.on('completed', (e) => completed.push(e.id));
  await w.start();
  await startedP;
  const t0 = Date.now();
  const outcome = await settledWithin(w.stop({ abort: true }), 3000);
  const took = Date.now() - t0;
  const row = await eventRow(id);
  release();   // the handler succeeds late: ignored
  await sleep(1200);   // past the lease: no extend kept it, nothing completed it
  assert.strictEqual(outcome, 'resolved', `stop({ abort: true }) still waits for the handler: ${w.messages.join(' | ')}`);
  assert.ok(took >= 450 && took < 2000, `stopped after ${took} ms`);
  assert.deepStrictEqual([row.state, row.attempts, row.last_error], ['pending', 1, 'worker shutting down']);
  assert.deepStrictEqual(completed, []);
  assert.deepStrictEqual((await eventRow(id)).state, 'pending');
  assert.ok(w.messages.some((m) => /still runs 0\.5 s after the abort: not waiting for it/.test(m)), w.messages.join('\n'));
  assert.ok(w.messages.includes('handed back 1 event(s)'), w.messages.join('\n'));
});

test('handleSignals: a third SIGTERM exits at once while a handler ignores the hand-back', async (t) => {
  const { child, logs, exit, slow } = await childAfterFirstSigterm(t, db, 'third', unique('nf.third'),
                                                                   { ignoreSignal: true, abortGrace: 60 });
  child.kill('SIGTERM');
  assert.ok(await waitFor(() => logs.includes('second SIGTERM: handing the events held back')), logs.join('\n'));
  const t0 = Date.now();
  child.kill('SIGTERM');
  assert.strictEqual(await exit, 143);
  assert.ok(Date.now() - t0 < 3000);
  assert.strictEqual((await eventRow(slow)).state, 'claimed');   // ends with its lease
});

test('a stalled connection: the local deadline aborts the handler before another worker runs the event; the worker then stops', async () => {
  const queue = unique('nf.stall');
  const id = await schedule(db, queue, 'stall');
  const proxy = await stallProxy();
  const log = [];
  let aSignal = null;
  const a = makeWorker({ queue, workerName: 'stall-a', lease: 1.5, queryTimeout: 2, connection: proxy.connection,
    handler: (e, { signal }) => new Promise((resolve, reject) => {
      aSignal = signal;
      log.push('A start');
      const t = setTimeout(resolve, 8000);
      signal.addEventListener('abort', () => { log.push('A aborted'); clearTimeout(t); reject(signal.reason); });
    }) });
  const lost = [];
  a.on('lost', (l) => { lost.push(l); log.push('A lost'); });
  try {
    await a.start();
    assert.ok(await waitFor(() => aSignal, 3000));
    proxy.stall();   // a network stall: A's heartbeat extend gets no answer, nor an error
    let aAbortedWhenBStarted = null;
    const b = makeWorker({ queue, workerName: 'stall-b', lease: 10,
      handler: async () => { aAbortedWhenBStarted = aSignal.aborted; log.push('B start'); } });
    await b.start();
    assert.ok(await waitFor(() => log.includes('B start'), 6000), 'B took the event over once A\'s lease ended');
    assert.strictEqual(aAbortedWhenBStarted, true, `A's handler still ran when B started the same event: ${log.join(', ')}`);
    assert.strictEqual(lost.length, 1);
    assert.match(lost[0].reason, /^no extend answered within its lease of 1\.5 s/);
    // A's session is stuck: A stops (a supervisor would restart it), it does not hang.
    const waited = await settledWithin(a.wait(), 4000);
    assert.strictEqual(waited, 'rejected', a.messages.join('\n'));
    await assert.rejects(a.wait(), { code: 'PG_THROTTLE_STALLED' });
  } finally {
    await proxy.close();
  }
  assert.ok(await waitFor(async () => (await eventRow(id)).state === 'done', 3000));
  const attempts = await rows(db, `SELECT attempt, claimed_by, outcome FROM throttle.attempt_history
                                   WHERE event_id = $1 ORDER BY attempt`, [id]);
  assert.deepStrictEqual(attempts, [{ attempt: 1, claimed_by: 'stall-a', outcome: 'expired' },
                                    { attempt: 2, claimed_by: 'stall-b', outcome: 'completed' }]);
});

test('a stalled connection while idle: the worker stops within queryTimeout instead of hanging', async () => {
  const queue = unique('nf.stallidle');
  const proxy = await stallProxy();
  try {
    const w = makeWorker({ queue, queryTimeout: 1, connection: proxy.connection, handler: async () => {} });
    const ready = new Promise((r) => w.once('ready', r));
    await w.start();
    await ready;
    proxy.stall();
    const t0 = Date.now();
    await assert.rejects(w.wait(), { code: 'PG_THROTTLE_STALLED' });
    assert.ok(Date.now() - t0 < 2500, `stopped after ${Date.now() - t0} ms`);
    assert.strictEqual(await settledWithin(w.stop(), 500), 'rejected');   // returns at once
  } finally {
    await proxy.close();
  }
});

// A delay over 2^31 - 1 ms fires after 1 ms (with a TimeoutOverflowWarning).
function overflowWarnings() {
  const seen = [];
  const onWarning = (w) => { if (w.name === 'TimeoutOverflowWarning') seen.push(w); };
  process.on('warning', onWarning);
  return () => { process.removeListener('warning', onWarning); return seen.length; };
}

test('pollSeconds above 24.8 days: the idle worker does not claim in a tight loop', async () => {
  const queue = unique('nf.poll');
  const w = makeWorker({ queue, pollSeconds: 30 * 24 * 3600, handler: async () => {} });
  let claims = 0;
  const orig = w._claim.bind(w);
  w._claim = () => { claims += 1; return orig(); };
  const done = overflowWarnings();
  await w.start();
  await sleep(1000);
  await new Promise((r) => setImmediate(r));
  assert.strictEqual(done(), 0);
  assert.ok(claims <= 2, `${claims} claims in 1 s while idle`);
});

test('a lease above 74 days: the heartbeat does not extend in a tight loop (no server needed)', async () => {
  const w = new Worker({ queue: 'nf.lease', lease: 80 * 24 * 3600, handler: () => sleep(1000) });
  let extends_ = 0;
  w._extend = async () => { extends_ += 1; return { n: 1, sentAt: performance.now() }; };
  w._complete = async (ids) => ids.length;
  const done = overflowWarnings();
  await w._work([{ id: '1', claim_token: '7', item_key: 'k', group_key: null }], performance.now());
  await new Promise((r) => setImmediate(r));
  assert.strictEqual(done(), 0);
  assert.strictEqual(extends_, 0);
});

test('queue names: 1 to 63 bytes (pg_throttle\'s limit, the LISTEN channel\'s too)', () => {
  const handler = async () => {};
  assert.throws(() => new Worker({ queue: 'q'.repeat(64), handler }), RangeError);
  assert.throws(() => new Worker({ queue: 'é'.repeat(32), handler }), RangeError);   // 64 bytes
  assert.strictEqual(new Worker({ queue: 'q'.repeat(63), handler }).queue.length, 63);
  assert.strictEqual(new Worker({ queue: `${'é'.repeat(31)}x`, handler }).queue.length, 32);
  assert.throws(() => new Worker({ queue: 'q', handler, abortGrace: -1 }), RangeError);
  assert.throws(() => new Worker({ queue: 'q', handler, queryTimeout: 0 }), RangeError);
});
