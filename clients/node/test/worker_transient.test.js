'use strict';
// The worker on a healthy server that is slow or refuses a statement for a moment: a query
// waiting on a lock (not a stalled connection), transient SQL errors of claim, complete and
// extend (serialization failures, deadlocks), a claim error that stops the worker while
// handlers run, a complete that would be sent after the local deadline, and a stop while a
// claim waits on a lock. From the second review (rev-node2).
const test = require('node:test');
const assert = require('node:assert');
const { schedule, scheduleMany } = require('..');
const { connect, unique, one, waitFor } = require('../testkit/db');
const { stallProxy } = require('../testkit/stall_proxy');
const { useWorkers, sleep, settledWithin } = require('../testkit/workers');

let db;
test.before(async () => { db = await connect(); });
test.after(() => db.end());
const makeWorker = useWorkers(test);
const eventRow = (id) => one(db, 'SELECT state, claimed_by, attempts FROM throttle.all_events WHERE id = $1', [id]);
const state = async (id) => (await eventRow(id)).state;
// A real server error with the given SQLSTATE, raised on the worker's own session.
const raise = (w, code) => w._query(`DO $$BEGIN RAISE EXCEPTION 'simulated ${code}' USING ERRCODE = '${code}'; END$$`);

// An operator's transaction that changes a group_policy and stays open: every claim_group of
// the database waits for it (docs/queue.md: the policy lock).
async function openPolicyChange() {
  const op = await connect();
  await op.query('BEGIN');
  await op.query('INSERT INTO throttle.group_policy (queue, workers) VALUES ($1, 2)', [unique('tr.policy.other')]);
  return { async commit() { await op.query('COMMIT'); await op.end(); } };
}

test('a claim_group waiting on a lock longer than queryTimeout: the server is asked, the worker waits (no PG_THROTTLE_STALLED, no orphaned claim)', async () => {
  const queue = unique('tr.policy');
  const w = makeWorker({ queue, groups: true, queryTimeout: 1, handler: async () => {} });
  await w.start();
  const op = await openPolicyChange();
  const id = await schedule(db, queue, 'b', { groupKey: 'g' });
  await sleep(1700);   // the claim waits past queryTimeout: the watchdog asks the server
  await op.commit();
  assert.ok(await waitFor(async () => w._fatal || (await state(id)) === 'done', 3000));
  assert.strictEqual(w._fatal, null, `the worker stopped: ${w.messages.join(' | ')}`);
  assert.ok(w.messages.some((m) => /waits on the server \(Lock/.test(m)), w.messages.join('\n'));
});

test('stop({ abort: true }) while a claim waits on a lock: returns after abortGrace, the claim is cancelled (pg_cancel_backend), nothing is left claimed', async () => {
  const queue = unique('tr.stoplock');
  const w = makeWorker({ queue, groups: true, abortGrace: 0.5, handler: async () => {} });
  const ready = new Promise((r) => w.once('ready', r));
  await w.start();
  await ready;
  const op = await openPolicyChange();
  let id;
  try {
    id = await schedule(db, queue, 'b', { groupKey: 'g' });
    await sleep(500);   // the worker's claim_group waits behind the policy change
    const t0 = Date.now();
    const outcome = await settledWithin(w.stop({ abort: true }), 4000);
    assert.strictEqual(outcome, 'resolved', w.messages.join('\n'));
    assert.ok(Date.now() - t0 < 3000, `stopped after ${Date.now() - t0} ms`);
  } finally {
    await op.commit();
  }
  await sleep(300);
  assert.deepStrictEqual(await eventRow(id), { state: 'pending', claimed_by: null, attempts: 0 }, w.messages.join('\n'));
  assert.ok(w.messages.some((m) => /cancelled its query in progress/.test(m)), w.messages.join('\n'));
});

test('a stalled answer on the worker\'s session while the listener works: the probe finds the backend idle, the worker stops', async () => {
  const queue = unique('tr.lostanswer');
  const proxy = await stallProxy();
  try {
    const w = makeWorker({ queue, queryTimeout: 1, connection: proxy.connection, handler: async () => {} });
    const ready = new Promise((r) => w.once('ready', r));
    await w.start();
    await ready;
    proxy.stall({ connection: 0 });   // the worker's first session: its queries'
    await assert.rejects(w.wait(), { code: 'PG_THROTTLE_STALLED' });
    assert.ok(w.messages.some((m) => /its backend is (idle|absent)/.test(m)), w.messages.join('\n'));
  } finally {
    await proxy.close();
  }
});

test('a claim that raises a transient error (40001, 40P01, 55P03, 57014): logged, claimed again, the worker goes on', async () => {
  const queue = unique('tr.claim40001');
  const id = await schedule(db, queue, 'a');
  const w = makeWorker({ queue, handler: async () => {} });
  const orig = w._claim.bind(w);
  const codes = ['40001', '40P01', '55P03', '57014'];
  let calls = 0;
  w._claim = async () => {
    if (calls < codes.length) await raise(w, codes[calls++]);
    return orig();
  };
  await w.start();
  assert.ok(await waitFor(async () => w._fatal || (await state(id)) === 'done', 5000));
  assert.strictEqual(w._fatal, null, `the worker stopped: ${w.messages.join(' | ')}`);
  for (const code of codes) {
    assert.ok(w.messages.some((m) => m.startsWith(`claim raised ${code}`)), w.messages.join('\n'));
  }
});

test('default_transaction_isolation=serializable: two workers drain 80 events, none stops, each event completed once', async () => {
  const queue = unique('tr.serializable');
  const n = 80;
  await scheduleMany(db, queue, Array.from({ length: n }, (_, i) => ({ itemKey: `k${i}` })));
  const completed = new Map();
  const ws = [0, 1].map((i) => {
    const w = makeWorker({ queue, concurrency: 3, workerName: `ser-${i}`,
      connection: { options: '-c default_transaction_isolation=serializable' }, handler: async () => {} });
    w.on('completed', (e) => completed.set(e.id, (completed.get(e.id) || 0) + 1));
    return w;
  });
  for (const w of ws) await w.start();
  assert.ok(await waitFor(() => ws.some((w) => w._fatal) || completed.size === n, 15000));
  for (const w of ws) assert.strictEqual(w._fatal, null, `a worker stopped: ${w.messages.join(' | ')}`);
  assert.strictEqual(completed.size, n);
  assert.ok([...completed.values()].every((c) => c === 1));
  const left = await one(db, `SELECT count(*)::int AS n FROM throttle.event WHERE queue = $1`, [queue]);
  assert.strictEqual(left.n, 0);
});

test('a claim error that stops the worker: a handler that succeeds within abortGrace is completed, and wait() settles after it', async () => {
  const queue = unique('tr.claimfatal');
  const id = await schedule(db, queue, 'a');
  let finished = false;
  let started;
  const startedP = new Promise((r) => { started = r; });
  const w = makeWorker({ queue, concurrency: 2, abortGrace: 2,
    handler: async () => { started(); await sleep(300); finished = true; } });
  const orig = w._claim.bind(w);
  let calls = 0;
  w._claim = async () => {
    if (calls++ === 1) { await startedP; await raise(w, '22012'); }
    return orig();
  };
  await w.start();
  await assert.rejects(w.wait(), { code: '22012' });
  assert.strictEqual(finished, true, 'wait() settled while a handler still ran');
  assert.strictEqual(await state(id), 'done', `not completed: ${w.messages.join(' | ')}`);
});

test('complete, fail and extend raising a deadlock or serialization failure (class 40) are retried', async () => {
  const queue = unique('tr.retry40');
  const [ok, bad] = await scheduleMany(db, queue, [{ itemKey: 'ok' }, { itemKey: 'bad' }]);
  let runs = 0;
  const lost = [];
  const completed = [];
  const failed = [];
  // lease 1.5: the heartbeat extends every 0.5 s while the 0.7 s handler runs.
  const w = makeWorker({ queue, lease: 1.5, retryIn: 600, concurrency: 2, handler: async (e) => {
    runs++;
    await sleep(700);
    if (e.item_key === 'bad') throw new Error('boom');
  } });
  w.on('lost', (l) => lost.push(l.reason));
  w.on('completed', (e) => completed.push(e.id));
  w.on('failed', (e) => failed.push(e.id));
  for (const [name, code] of [['_complete', '40P01'], ['_fail', '40001'], ['_extend', '40P01']]) {
    const orig = w[name].bind(w);
    let calls = 0;
    w[name] = async (...args) => {
      if (calls++ === 0) await raise(w, code);
      return orig(...args);
    };
  }
  await w.start();
  assert.ok(await waitFor(() => lost.length > 0 || (completed.length === 1 && failed.length === 1), 6000), w.messages.join('\n'));
  assert.deepStrictEqual(lost, []);
  assert.deepStrictEqual([completed, failed], [[ok], [bad]]);
  assert.strictEqual(await state(ok), 'done');
  assert.strictEqual(await state(bad), 'pending');
  assert.strictEqual(runs, 2);
});

test('past the local deadline nothing is sent: a complete queued behind a slow extend is not sent, and lost and completed are never both emitted', async () => {
  const queue = unique('tr.deadline');
  const id = await schedule(db, queue, 'a');
  const events = [];
  // lease 1.5: the heartbeat extends at 0.5 s, the local deadline is 1.5 - 0.25 = 1.25 s
  // after the claim was sent. The server answers that extend after 1 s (slow, but within
  // queryTimeout 5 s); the handler succeeds at 1 s, before the deadline, and its complete
  // waits behind the extend until past the deadline.
  const w = makeWorker({ queue, lease: 1.5, queryTimeout: 5, handler: async () => { await sleep(1000); } });
  w._extend = async (ids, token, guard) => {
    const { rows, sentAt } = await w._query(
      'SELECT throttle.extend($1::bigint[], $2::bigint, make_interval(secs => $3)) AS n FROM pg_sleep(1)',
      [ids, token, w.lease], guard);
    return { n: rows[0].n, sentAt };
  };
  let completes = 0;
  const orig = w._complete.bind(w);
  w._complete = (...args) => { completes++; return orig(...args); };
  w.on('lost', () => events.push('lost'));
  w.on('completed', () => events.push('completed'));
  await w.start();
  assert.ok(await waitFor(async () => (await state(id)) === 'done' || events.includes('lost'), 5000));
  await sleep(800);
  assert.ok(!(events.includes('lost') && events.includes('completed')),
            `both lost and completed: ${events.join(', ')} (event ${await state(id)})`);
  if (events.includes('lost')) {
    assert.strictEqual(await state(id), 'claimed', 'a complete was sent after the claim was given up');
    assert.ok(w.messages.some((m) => /not sent: the claim was given up/.test(m)) || completes === 0, w.messages.join('\n'));
  }
});

test('one extend at a time: a heartbeat whose extend has not answered yet sends no other', async () => {
  const queue = unique('tr.onebeat');
  const id = await schedule(db, queue, 'a');
  // lease 1.5: a beat every 0.5 s; each extend takes 0.7 s before it is sent.
  const w = makeWorker({ queue, lease: 1.5, handler: () => sleep(1100) });
  const orig = w._extend.bind(w);
  let inFlight = 0;
  let most = 0;
  let calls = 0;
  w._extend = async (...args) => {
    calls++;
    most = Math.max(most, ++inFlight);
    try {
      await sleep(700);
      return await orig(...args);
    } finally {
      inFlight--;
    }
  };
  const lost = [];
  w.on('lost', (l) => lost.push(l.reason));
  await w.start();
  assert.ok(await waitFor(async () => lost.length > 0 || (await state(id)) === 'done', 5000));
  assert.deepStrictEqual(lost, []);
  assert.ok(calls >= 1);
  assert.strictEqual(most, 1, `${most} extends at once`);
});

test('a slow claim: the first extend is timed from when the claim was sent, so the claim is not given up at once', async () => {
  const queue = unique('tr.slowclaim');
  const id = await schedule(db, queue, 'a');
  // lease 1.5: the local deadline is 1.25 s after the claim was sent; its answer is read 0.9 s
  // after it was sent, and the handler runs 0.6 s.
  const w = makeWorker({ queue, lease: 1.5, handler: () => sleep(600) });
  const orig = w._claim.bind(w);
  w._claim = async () => {
    const got = await orig();
    if (got.events.length > 0) await sleep(900);
    return got;
  };
  const lost = [];
  const completed = [];
  w.on('lost', (l) => lost.push(l.reason));
  w.on('completed', (e) => completed.push(e.id));
  await w.start();
  assert.ok(await waitFor(() => lost.length > 0 || completed.length > 0, 5000));
  assert.deepStrictEqual([lost, completed], [[], [id]]);
});

test('strict order: a heartbeat between the failure and the explicit extend reports the later events left, not lost', async () => {
  const queue = unique('tr.strictbeat');
  await db.query('INSERT INTO throttle.group_policy (queue, workers, strict_order) VALUES ($1, 1, true)', [queue]);
  const ids = [];
  for (const step of [1, 2]) ids.push(await schedule(db, queue, `step:${step}`, { groupKey: 'g' }));
  // lease 1.5: a beat every 0.5 s; the fail's answer is read 0.7 s after it came, so a beat
  // extends the later event (handed back by the fail) before the worker's own extend does.
  const w = makeWorker({ queue, groups: true, lease: 1.5, retryIn: 600,
    handler: async (e) => { if (e.item_key === 'step:1') throw new Error('first fails'); } });
  const orig = w._fail.bind(w);
  w._fail = async (...args) => {
    const n = await orig(...args);
    await sleep(700);
    return n;
  };
  const lost = [];
  const left = [];
  const failed = [];
  w.on('lost', (l) => lost.push(l.reason));
  w.on('left', (l) => left.push(l.ids));
  w.on('failed', (e) => failed.push(e.id));
  await w.start();
  assert.ok(await waitFor(() => lost.length > 0 || (left.length > 0 && failed.length > 0), 5000));
  await sleep(200);
  assert.deepStrictEqual([lost, left, failed], [[], [[ids[1]]], [ids[0]]]);
});

test('the sessions use TCP keepalives, the first probe after 10 s of silence', async () => {
  const w = makeWorker({ queue: unique('tr.keepalive'), handler: async () => {} });
  await w.start();
  for (const client of [w._db, w._listener]) {
    assert.deepStrictEqual([client.connection._keepAlive, client.connection._keepAliveInitialDelayMillis], [true, 10000]);
  }
});
