'use strict';
const test = require('node:test');
const assert = require('node:assert');
const { Worker, scheduleMany, schedule } = require('..');
const { connect, unique, one, rows, waitFor } = require('../testkit/db');

let db;
const workers = [];   // stopped (aborted) after each test, whatever happened
test.before(async () => { db = await connect(); });
test.afterEach(async () => {
  await Promise.allSettled(workers.splice(0).map((w) => w.stop({ abort: true })));
});
test.after(() => db.end());

function startWorker(options) {
  const w = new Worker({ pollSeconds: 0.3, lease: 10, ...options });
  w.messages = [];
  w.on('log', (m) => w.messages.push(m));
  w.isReady = false;
  w.once('ready', () => { w.isReady = true; });
  workers.push(w);
  return w.start();
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal && signal.aborted) return reject(signal.reason);
    const t = setTimeout(resolve, ms);
    if (signal) signal.addEventListener('abort', () => { clearTimeout(t); reject(signal.reason); }, { once: true });
  });
}

function count(list) {
  const c = new Map();
  for (const x of list) c.set(x, (c.get(x) || 0) + 1);
  return c;
}

test('a worker with concurrency 3 drains a queue, each event completed exactly once', async () => {
  const queue = unique('nw.drain');
  const ids = await scheduleMany(db, queue, Array.from({ length: 60 }, (_, i) => ({ itemKey: `job:${i}` })));
  const handled = [];
  const completed = [];
  let running = 0;
  let most = 0;
  const w = await startWorker({
    queue, workerName: 'drain-0', concurrency: 3, max: 2,
    handler: async (event, ctx) => {
      running += 1;
      most = Math.max(most, running);
      assert.strictEqual(ctx.token, event.claim_token);
      await sleep(10);
      handled.push(event.id);
      running -= 1;
    },
  });
  w.on('completed', (e) => completed.push(e.id));
  assert.ok(await waitFor(() => completed.length >= 60, 20000), `${completed.length} of 60 completed`);
  await w.stop();
  assert.deepStrictEqual([...count(handled).values()].every((n) => n === 1) && handled.length, 60);
  assert.deepStrictEqual([...completed].sort(), [...ids].sort());
  assert.ok(most > 1, `handlers ran at once: ${most}`);
  const history = await rows(db, 'SELECT id, state, attempts, completed_by FROM throttle.event_history WHERE queue = $1',
                             [queue]);
  assert.strictEqual(history.length, 60);
  assert.ok(history.every((h) => h.state === 'done' && h.attempts === 1 && h.completed_by === 'drain-0'));
  assert.strictEqual((await one(db, 'SELECT count(*)::int AS n FROM throttle.event WHERE queue = $1', [queue])).n, 0);
});

test('claim_group: no group on two workers at once', async () => {
  const queue = unique('nw.groups');
  const items = [];
  for (let g = 0; g < 8; g++) for (let i = 0; i < 4; i++) items.push({ itemKey: `e:${g}:${i}`, groupKey: `g${g}` });
  await scheduleMany(db, queue, items);
  const runs = [];   // { worker, group, start, end }
  const completed = [];
  const handler = (name) => async (event) => {
    const start = process.hrtime.bigint();
    await sleep(15);
    runs.push({ worker: name, group: event.group_key, start, end: process.hrtime.bigint() });
  };
  const ws = [];
  for (const name of ['grp-0', 'grp-1', 'grp-2']) {
    const w = await startWorker({ queue, workerName: name, groups: true, concurrency: 2, handler: handler(name) });
    w.on('completed', (e) => completed.push(e.id));
    ws.push(w);
  }
  assert.ok(await waitFor(() => completed.length >= 32, 20000), `${completed.length} of 32 completed`);
  await Promise.all(ws.map((w) => w.stop()));
  assert.strictEqual(new Set(completed).size, 32);
  const overlaps = [];
  for (const a of runs) {
    for (const b of runs) {
      if (a.group === b.group && a.worker !== b.worker && a.start <= b.start && b.start < a.end) overlaps.push([a, b]);
    }
  }
  assert.deepStrictEqual(overlaps, []);
  assert.ok(new Set(runs.map((r) => r.worker)).size > 1, 'more than one worker took groups');
  const done = await one(db, "SELECT count(*)::int AS n FROM throttle.event_history WHERE queue = $1 AND state = 'done'", [queue]);
  assert.strictEqual(done.n, 32);
});

test('the heartbeat keeps a claim past its lease while the handler runs', async () => {
  const queue = unique('nw.heartbeat');
  const id = await schedule(db, queue, 'long');
  const handled = [];
  await startWorker({ queue, workerName: 'beat-0', lease: 1.5,
                      handler: async (e) => { await sleep(3200); handled.push(['beat-0', e.id]); } });
  assert.ok(await waitFor(async () => (await one(db, "SELECT state FROM throttle.event WHERE id = $1", [id]))?.state === 'claimed'));
  // An idle worker polling often would take an expired claim over.
  await startWorker({ queue, workerName: 'beat-1', lease: 1.5, handler: async (e) => { handled.push(['beat-1', e.id]); } });
  assert.ok(await waitFor(async () => (await one(db, 'SELECT state FROM throttle.event_history WHERE id = $1', [id]))?.state === 'done', 10000));
  const ev = await one(db, 'SELECT attempts, completed_by FROM throttle.event_history WHERE id = $1', [id]);
  assert.deepStrictEqual(ev, { attempts: 1, completed_by: 'beat-0' });
  assert.deepStrictEqual(handled, [['beat-0', id]]);
  assert.strictEqual((await one(db, 'SELECT count(*)::int AS n FROM throttle.event_attempt WHERE event_id = $1', [id])).n, 0);
});

test('a lost claim (release_group): the signal aborts, nothing is completed, the event runs again', async () => {
  const queue = unique('nw.lost');
  const id = await schedule(db, queue, 'lost', { groupKey: 'g' });
  const runs = [];
  const lostEvents = [];
  const w = await startWorker({
    queue, workerName: 'lost-0', groups: true, lease: 1.2,
    handler: async (event, { signal }) => {
      const run = { attempt: event.attempts, aborted: false };
      runs.push(run);
      if (event.attempts > 1) return;
      try {
        await sleep(10000, signal);
      } catch (err) {
        run.aborted = signal.aborted;
        throw err;
      }
    },
  });
  w.on('lost', (l) => lostEvents.push(l));
  assert.ok(await waitFor(() => runs.length === 1));
  await db.query('SELECT throttle.release_group($1, $2)', [queue, 'g']);
  assert.ok(await waitFor(async () => (await one(db, 'SELECT state FROM throttle.all_events WHERE id = $1', [id])).state === 'done', 10000));
  assert.deepStrictEqual(runs, [{ attempt: 1, aborted: true }, { attempt: 2, aborted: false }]);
  assert.strictEqual(lostEvents.length, 1);
  assert.deepStrictEqual(lostEvents[0].ids, [id]);
  assert.ok(w.messages.some((m) => /^claim \d+ lost \(extended 0 of 1\); stopping its work$/.test(m)), w.messages.join('\n'));
  const history = await rows(db, 'SELECT attempt, outcome FROM throttle.attempt_history WHERE event_id = $1 ORDER BY claimed_at', [id]);
  assert.deepStrictEqual(history, [{ attempt: 1, outcome: 'released' }, { attempt: 2, outcome: 'completed' }]);
});

test('a lost claim (its lease ended, another worker took it over): aborted, not completed', async () => {
  const queue = unique('nw.expired');
  const id = await schedule(db, queue, 'slow');
  const runs = [];
  const a = await startWorker({
    queue, workerName: 'exp-a', lease: 3,
    handler: async (event, { signal }) => {
      const run = { worker: 'exp-a', attempt: event.attempts, aborted: false };
      runs.push(run);
      try {
        await sleep(10000, signal);
      } catch (err) {
        run.aborted = signal.aborted;
        throw err;
      }
    },
  });
  const lost = [];
  a.on('lost', (l) => lost.push(l));
  assert.ok(await waitFor(() => runs.length === 1));
  // Worker B's session runs an hour ahead (pg_throttle.test_clock): to it, A's lease has
  // ended, and its claim takes the event over; A's next heartbeat finds the claim gone.
  const ahead = new Date(Date.now() + 3600e3).toISOString();
  await startWorker({ queue, workerName: 'exp-b', lease: 3,
                      connection: { options: `-c pg_throttle.test_clock=${ahead}` },
                      handler: async (event) => { runs.push({ worker: 'exp-b', attempt: event.attempts, aborted: false }); } });
  assert.ok(await waitFor(() => lost.length === 1 && runs.length === 2, 10000), JSON.stringify(runs));
  assert.deepStrictEqual(runs, [{ worker: 'exp-a', attempt: 1, aborted: true }, { worker: 'exp-b', attempt: 2, aborted: false }]);
  assert.ok(await waitFor(async () => (await one(db, 'SELECT state FROM throttle.all_events WHERE id = $1', [id])).state === 'done'));
  const ev = await one(db, 'SELECT attempts, completed_by FROM throttle.event_history WHERE id = $1', [id]);
  assert.deepStrictEqual(ev, { attempts: 2, completed_by: 'exp-b' });
  const history = await rows(db, 'SELECT attempt, claimed_by, outcome FROM throttle.attempt_history WHERE event_id = $1 ORDER BY attempt', [id]);
  assert.deepStrictEqual(history, [{ attempt: 1, claimed_by: 'exp-a', outcome: 'expired' },
                                   { attempt: 2, claimed_by: 'exp-b', outcome: 'completed' }]);
});

test('a failing handler: fail with the error and retryIn sets run_at (an error may carry its own retryIn)', async () => {
  const queue = unique('nw.fail');
  const [plain, own] = await scheduleMany(db, queue, [{ itemKey: 'plain' }, { itemKey: 'own' }]);
  const failed = [];
  const w = await startWorker({
    queue, workerName: 'fail-0', retryIn: 30, max: 2,
    handler: async (event) => {
      const err = new Error(`boom ${event.item_key}`);
      if (event.item_key === 'own') err.retryIn = 120;
      throw err;
    },
  });
  w.on('failed', (e, err) => failed.push([e.id, err.message]));
  assert.ok(await waitFor(() => failed.length === 2));
  await w.stop();
  const got = await rows(db, `SELECT id, state, attempts, last_error,
                                     round(extract(epoch FROM run_at - failed_at)) AS retry_s
                              FROM throttle.event WHERE queue = $1 ORDER BY id`, [queue]);
  assert.deepStrictEqual(got, [
    { id: plain, state: 'pending', attempts: 1, last_error: 'boom plain', retry_s: '30' },
    { id: own, state: 'pending', attempts: 1, last_error: 'boom own', retry_s: '120' },
  ]);
  assert.ok(w.messages.includes(`event ${plain} (plain) failed: boom plain`), w.messages.join('\n'));
});

test('stop() finishes the events held; stop({ abort: true }) hands them back at once', async () => {
  const queue = unique('nw.stop');
  const [first, second] = await scheduleMany(db, queue, [{ itemKey: 'first' }, { itemKey: 'second' }]);
  let started = 0;
  const w = await startWorker({ queue, workerName: 'stop-0',
                                handler: async (e, { signal }) => { started += 1; await sleep(e.item_key === 'first' ? 800 : 30000, signal); } });
  assert.ok(await waitFor(() => started === 1));
  await w.stop();   // graceful: the first event completes, the second is never claimed
  assert.deepStrictEqual(await one(db, 'SELECT state, completed_by FROM throttle.event_history WHERE id = $1', [first]),
                         { state: 'done', completed_by: 'stop-0' });
  assert.strictEqual((await one(db, 'SELECT state FROM throttle.event WHERE id = $1', [second])).state, 'pending');

  const handedBack = [];
  const w2 = await startWorker({ queue, workerName: 'stop-1',
                                 handler: async (e, { signal }) => { started += 1; await sleep(30000, signal); } });
  w2.on('handedBack', (h) => handedBack.push(h));
  assert.ok(await waitFor(() => started === 2));
  const t0 = Date.now();
  await w2.stop({ abort: true });
  assert.ok(Date.now() - t0 < 3000);
  assert.deepStrictEqual(handedBack.map((h) => h.ids), [[second]]);
  const ev = await one(db, 'SELECT state, attempts, last_error, run_at <= now() AS due FROM throttle.event WHERE id = $1', [second]);
  assert.deepStrictEqual(ev, { state: 'pending', attempts: 1, last_error: 'worker shutting down', due: true });
});

test('batch: the handler gets the claim\'s events together', async () => {
  const queue = unique('nw.batch');
  const ids = await scheduleMany(db, queue, Array.from({ length: 6 }, (_, i) => ({ itemKey: `b:${i}` })));
  const batches = [];
  const w = await startWorker({ queue, workerName: 'batch-0', max: 3, batch: true,
                                handler: async (events) => { batches.push(events.map((e) => e.id)); } });
  const completed = [];
  w.on('completed', (e) => completed.push(e.id));
  assert.ok(await waitFor(() => completed.length === 6));
  await w.stop();
  assert.deepStrictEqual(batches.map((b) => b.length), [3, 3]);
  assert.deepStrictEqual(batches.flat().sort(), [...ids].sort());
});

test('LISTEN wakes an idle worker, also when a run_at ahead falls due', async () => {
  const queue = unique('nw.listen');
  const handled = [];
  const w = await startWorker({ queue, workerName: 'listen-0', pollSeconds: 30,
                                handler: async (e) => { handled.push({ key: e.item_key, at: Date.now() }); } });
  assert.ok(await waitFor(() => w.isReady));
  await sleep(200);   // asleep in its 30 s poll interval now
  const t0 = Date.now();
  await schedule(db, queue, 'now');
  assert.ok(await waitFor(() => handled.length === 1, 5000));
  assert.ok(handled[0].at - t0 < 1000, `woken after ${handled[0].at - t0} ms`);
  const due = Date.now() + 1500;
  await schedule(db, queue, 'later', { runAt: new Date(due) });
  assert.ok(await waitFor(() => handled.length === 2, 8000));
  assert.ok(handled[1].at >= due - 50 && handled[1].at - due < 1500, `handled ${handled[1].at - due} ms after run_at`);
});

test('strict order: after a failure the claim\'s later events are left, and run after the retry', async () => {
  const queue = unique('nw.strict');
  await db.query('INSERT INTO throttle.group_policy (queue, workers, strict_order) VALUES ($1, 1, true)', [queue]);
  const ids = [];
  for (const step of [1, 2, 3]) ids.push(await schedule(db, queue, `step:${step}`, { groupKey: 'g' }));
  const runs = [];
  const left = [];
  const w = await startWorker({
    queue, workerName: 'strict-0', groups: true, retryIn: 0.3, pollSeconds: 0.2,
    handler: async (e) => {
      runs.push([e.item_key, e.attempts]);
      if (e.item_key === 'step:1' && e.attempts === 1) throw new Error('first try fails');
    },
  });
  w.on('left', (l) => left.push(l.ids));
  assert.ok(await waitFor(async () => (await one(db, "SELECT count(*)::int AS n FROM throttle.event_history WHERE id = ANY($1) AND state = 'done'", [ids])).n === 3, 10000));
  assert.deepStrictEqual(runs, [['step:1', 1], ['step:1', 2], ['step:2', 1], ['step:3', 1]]);
  assert.deepStrictEqual(left, [[ids[1], ids[2]]]);
  assert.ok(!w.messages.some((m) => / lost \(/.test(m)), w.messages.join('\n'));
});

test('a lost connection stops the worker: wait() rejects, the log says why', async () => {
  const queue = unique('nw.conn');
  const name = unique('conn');
  const w = await startWorker({ queue, workerName: name, handler: async () => {} });
  const errors = [];
  w.on('error', (err) => errors.push(err));
  assert.ok(await waitFor(() => w.isReady));
  await db.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1',
                 [`pg-throttle worker ${name}`]);
  await assert.rejects(w.wait());
  assert.strictEqual(errors.length, 1);
  assert.ok(w.messages.some((m) => m.startsWith('connection lost: ')), w.messages.join('\n'));
});

test('options are checked', () => {
  assert.throws(() => new Worker({ handler: () => {} }), TypeError);
  assert.throws(() => new Worker({ queue: 'q' }), TypeError);
  assert.throws(() => new Worker({ queue: 'q', handler: () => {}, concurrency: 0 }), RangeError);
  assert.throws(() => new Worker({ queue: 'q', handler: () => {}, lease: 0 }), RangeError);
  assert.throws(() => new Worker({ queue: 'q', handler: () => {}, max: null }), RangeError);
});
