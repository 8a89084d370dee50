'use strict';
const test = require('node:test');
const assert = require('node:assert');
const { Pool } = require('pg');
const { withLease } = require('..');
const { connect, unique, one } = require('../testkit/db');

const clients = [];
async function client() {
  const c = await connect();
  clients.push(c);
  return c;
}
test.after(() => Promise.allSettled(clients.map((c) => c.end())));

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal && signal.aborted) return reject(signal.reason);
    const t = setTimeout(resolve, ms);
    if (signal) signal.addEventListener('abort', () => { clearTimeout(t); reject(signal.reason); }, { once: true });
  });
}

test('two holders never overlap: the second fails at once, or waits; fence tokens increase', async () => {
  const name = unique('nl.two');
  const [a, b, c] = [await client(), await client(), await client()];
  const spans = [];
  let firstIn;
  const entered = new Promise((r) => { firstIn = r; });
  const first = withLease(a, name, 5, async ({ fence, token, signal }) => {
    assert.strictEqual(fence, token);
    assert.strictEqual(typeof fence, 'string');
    assert.ok(!signal.aborted);
    const span = { who: 'a', fence: BigInt(fence), start: Date.now() };
    firstIn();
    await sleep(400);
    span.end = Date.now();
    spans.push(span);
    return 'a-result';
  });
  await entered;
  await assert.rejects(withLease(b, name, 5, async () => assert.fail('ran without the lock')),
                       { code: 'PG_THROTTLE_LOCK_BUSY' });
  const second = withLease(c, name, 5, async ({ fence }) => {
    spans.push({ who: 'c', fence: BigInt(fence), start: Date.now(), end: Date.now() });
    return 'c-result';
  }, { wait: 5, holder: 'test c' });
  assert.deepStrictEqual(await Promise.all([first, second]), ['a-result', 'c-result']);
  assert.deepStrictEqual(spans.map((s) => s.who), ['a', 'c']);
  assert.ok(spans[1].start >= spans[0].end, 'c entered after a left');
  assert.ok(spans[1].fence > spans[0].fence, 'the fence token increases');
  // Unlocked at the end: free for anyone.
  assert.strictEqual((await one(a, 'SELECT count(*)::int AS n FROM throttle.locks WHERE name = $1', [name])).n, 0);
});

test('renewals keep the lease past its ttl while the function runs', async () => {
  const name = unique('nl.renew');
  const [a, b] = [await client(), await client()];
  const result = await withLease(a, name, 1.5, async ({ signal }) => {
    await sleep(3200, signal);
    // 3.2 s into a 1.5 s lease: still held by this holder.
    const other = await one(b, 'SELECT throttle.lock($1, ttl => $2) AS token', [name, '5 seconds']);
    assert.strictEqual(other.token, null);
    return 'done';
  });
  assert.strictEqual(result, 'done');
  assert.notStrictEqual((await one(b, 'SELECT throttle.lock($1, ttl => $2) AS token', [name, '1 second'])).token, null);
});

test('a lost lease aborts the signal, and withLease rejects with PG_THROTTLE_LEASE_LOST', async () => {
  const name = unique('nl.lost');
  const [a, b] = [await client(), await client()];
  let aborted = false;
  await assert.rejects(withLease(a, name, 1.5, async ({ signal }) => {
    await b.query("SELECT throttle.reset($1, 'lock')", [name]);   // an operator clears it
    const taken = await one(b, 'SELECT throttle.lock($1, ttl => $2) AS token', [name, '10 seconds']);
    assert.notStrictEqual(taken.token, null);
    try {
      await sleep(5000, signal);   // the next renewal (every 0.5 s) fails
    } catch (err) {
      aborted = signal.aborted;
      throw err;
    }
  }), (err) => {
    assert.strictEqual(err.code, 'PG_THROTTLE_LEASE_LOST');
    assert.match(err.message, /was lost: renew found the token no longer current/);
    return true;
  });
  assert.ok(aborted);
  // The new holder's lock was left alone.
  assert.strictEqual((await one(b, 'SELECT count(*)::int AS n FROM throttle.locks WHERE name = $1', [name])).n, 1);
});

test('a function that throws: its error, and the lock released', async () => {
  const name = unique('nl.throw');
  const a = await client();
  await assert.rejects(withLease(a, name, 5, async () => { throw new Error('work failed'); }), /work failed/);
  assert.strictEqual((await one(a, 'SELECT count(*)::int AS n FROM throttle.locks WHERE name = $1', [name])).n, 0);
  await assert.rejects(withLease(a, name, 0, async () => {}), RangeError);
});

test('a Client whose fn runs a long query: the local deadline aborts the signal before another holder can get the lock', async () => {
  const [a, b] = [await client(), await client()];
  const name = unique('nl.longq');
  let signal;
  let abortedAt = null;
  const t0 = Date.now();
  const run = withLease(a, name, 1, async (ctx) => {
    signal = ctx.signal;
    signal.addEventListener('abort', () => { abortedAt = Date.now() - t0; });
    await a.query('SELECT pg_sleep(2.5)');   // the renewals wait behind it on this Client
  }).catch((e) => e);
  await sleep(1700);
  const otherGot = (await one(b, "SELECT throttle.lock($1, ttl => '5 seconds') AS t", [name])).t;
  const abortedWhenOtherGot = signal.aborted;
  const outcome = await run;
  assert.ok(otherGot !== null, 'the other session took the lock once the ttl passed');
  assert.strictEqual(abortedWhenOtherGot, true, 'a second holder had the lock while fn ran with its signal not aborted');
  assert.ok(abortedAt !== null && abortedAt < 1000, `aborted ${abortedAt} ms in`);
  assert.strictEqual(outcome.code, 'PG_THROTTLE_LEASE_LOST');
  assert.match(outcome.message, /no renewal answered within the ttl of 1 s/);
  // The other holder's lock was left alone by the unlock of the stale token.
  assert.strictEqual((await one(b, 'SELECT count(*)::int AS n FROM throttle.locks WHERE name = $1', [name])).n, 1);
});

test('a Pool: the renewals take a free connection of it, not held up by a long query of fn\'s on the pool', async () => {
  const pool = new Pool({ max: 2 });
  const b = await client();
  const name = unique('nl.pool');
  try {
    const result = await withLease(pool, name, 1, async ({ signal }) => {
      // A query of 2.5 s on one of the pool's two connections; the renewals take the other.
      await pool.query('SELECT pg_sleep(2.5)');
      assert.strictEqual(signal.aborted, false);
      const other = await one(b, "SELECT throttle.lock($1, ttl => '5 seconds') AS t", [name]);
      assert.strictEqual(other.t, null);
      return 'kept';
    });
    assert.strictEqual(result, 'kept');
  } finally {
    await pool.end();
  }
  assert.strictEqual((await one(b, 'SELECT count(*)::int AS n FROM throttle.locks WHERE name = $1', [name])).n, 0);
});

test('a renewal that errors once: the lease is lost, and unlocked anyway', async () => {
  const a = await client();
  const name = unique('nl.flaky');
  let failed = false;
  const flaky = { query: (sql, p) => {
    if (/throttle\.renew/.test(sql) && !failed) { failed = true; return Promise.reject(new Error('Connection terminated unexpectedly')); }
    return a.query(sql, p);
  } };
  const outcome = await withLease(flaky, name, 3, () => sleep(1500)).catch((e) => e);
  assert.strictEqual(outcome.code, 'PG_THROTTLE_LEASE_LOST');
  assert.match(outcome.message, /renew failed: Connection terminated unexpectedly/);
  assert.strictEqual((await one(a, 'SELECT count(*)::int AS n FROM throttle.locks WHERE name = $1', [name])).n, 0,
                     'the lease stayed held for its ttl after withLease rejected');
});

test('a ttl above 74 days does not renew in a tight loop (no server needed)', async () => {
  const calls = [];
  const fake = { query: async (sql) => {
    calls.push(sql);
    if (/extversion/.test(sql)) return { rows: [{ extversion: '0.4.0' }] };
    if (/throttle\.lock/.test(sql)) return { rows: [{ token: '5' }] };
    return { rows: [{ ok: true }] };
  } };
  let warnings = 0;
  const onWarning = (w) => { if (w.name === 'TimeoutOverflowWarning') warnings += 1; };
  process.on('warning', onWarning);
  try {
    assert.strictEqual(await withLease(fake, 'nl.huge', 80 * 24 * 3600, () => sleep(500).then(() => 'ok')), 'ok');
    await new Promise((r) => setImmediate(r));
  } finally {
    process.removeListener('warning', onWarning);
  }
  assert.strictEqual(warnings, 0);
  assert.strictEqual(calls.filter((s) => /throttle\.renew/.test(s)).length, 0);
});

test('a lock had after a long wait: renewed at once, so the lease is reckoned from then', async () => {
  const [a, b] = [await client(), await client()];
  const name = unique('nl.waited');
  const first = withLease(a, name, 5, () => sleep(1500));
  await sleep(100);
  let aborted = null;
  const result = await withLease(b, name, 1, async ({ signal }) => { await sleep(300); aborted = signal.aborted; return 'ran'; },
                                 { wait: 5 });
  await first;
  assert.deepStrictEqual([result, aborted], ['ran', false]);
});
