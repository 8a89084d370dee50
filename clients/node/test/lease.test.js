'use strict';
const test = require('node:test');
const assert = require('node:assert');
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
