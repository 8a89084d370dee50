'use strict';
const test = require('node:test');
const assert = require('node:assert');
const http = require('node:http');
const path = require('node:path');
const { fork } = require('node:child_process');
const { Pool } = require('pg');
const { rateLimit, withRateLimit, take } = require('..');
const { connect, unique, one } = require('../testkit/db');

// Every session of the pool runs on a fixed clock: the answers are exact.
const CLOCK = '2026-01-01T00:00:00Z';
const clocked = () => new Pool({ max: 4, options: `-c pg_throttle.test_clock=${CLOCK}` });

async function serve(handler) {
  const server = http.createServer(handler);
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { server, url: `http://127.0.0.1:${server.address().port}` };
}

async function get(url, headers = {}) {
  const res = await fetch(url, { headers });
  const body = await res.json();
  const h = (n) => res.headers.get(n);
  return { status: res.status, body, limit: h('ratelimit-limit'), remaining: h('ratelimit-remaining'),
           reset: h('ratelimit-reset'), retryAfter: h('retry-after') };
}

test('Express-style middleware on a real http server: 200s, then 429 with the headers take gives', async (t) => {
  const pool = clocked();
  const mw = rateLimit(pool, { rate: 1, per: 10, burst: 3 });
  const passed = [];
  const { server, url } = await serve((req, res) => mw(req, res, (err) => {
    assert.ifError(err);
    passed.push(req.rateLimit);
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end('{"ok":true}');
  }));
  const db = await connect({ options: `-c pg_throttle.test_clock=${CLOCK}` });
  t.after(async () => { server.closeAllConnections(); server.close(); await pool.end(); await db.end(); });
  const key = unique('rl-test');
  const answers = [];
  for (let i = 0; i < 4; i++) answers.push(await get(url, { 'X-Api-Key': key }));
  const summary = answers.map((a) => [a.status, a.limit, a.remaining, a.reset, a.retryAfter]);
  assert.deepStrictEqual(summary, [
    [200, '3', '2', '10', null],
    [200, '3', '1', '20', null],
    [200, '3', '0', '30', null],
    [429, '3', '0', '30', '10'],
  ]);
  assert.deepStrictEqual(answers[3].body, { error: 'rate limited', retry_after_s: 10 });
  assert.deepStrictEqual(passed.map((p) => p.remaining), [2, 1, 0]);
  // throttle.take itself, peeking (cost 0) at the same bucket on the same clock.
  const peek = await one(db, `SELECT remaining, extract(epoch FROM retry_after)::float8 AS retry,
                                     extract(epoch FROM reset_after)::float8 AS reset
                              FROM throttle.take($1, 1, '10 seconds', 3, 0)`, [`api:key:${key}`]);
  assert.deepStrictEqual(peek, { remaining: 0, retry: 10, reset: 30 });
  // take() answers the same as the SQL function.
  assert.deepStrictEqual(await take(pool, `api:key:${key}`, { rate: 1, per: 10, burst: 3, cost: 0 }),
                         { allowed: false, remaining: 0, retryAfter: 10, resetAfter: 30 });
  // Another key has a bucket of its own.
  assert.strictEqual((await get(url, { 'X-Api-Key': `${key}-other` })).remaining, '2');
});

test('withRateLimit wraps a plain http handler: 400 on a key too long or missing, custom key and cost', async (t) => {
  const pool = clocked();
  const logged = [];
  const prefix = unique('rl-user');
  const handler = withRateLimit(pool, {
    rate: 10, per: 1, burst: 10,
    key: (req) => (req.headers['x-user'] ? `${prefix}:${req.headers['x-user']}` : null),
    cost: (req) => (req.url === '/expensive' ? 4 : 1),
    log: (m) => logged.push(m),
  }, (req, res) => { res.writeHead(200); res.end('{"ok":true}'); });
  const { server, url } = await serve(handler);
  t.after(async () => { server.closeAllConnections(); server.close(); await pool.end(); });

  assert.deepStrictEqual((await get(`${url}/`, { 'X-User': 'u1' })).remaining, '9');
  assert.deepStrictEqual((await get(`${url}/expensive`, { 'X-User': 'u1' })).remaining, '5');
  const none = await get(`${url}/`);
  assert.deepStrictEqual([none.status, none.body], [400, { error: 'no client address' }]);
  assert.match(logged[0], /^GET \/: no rate-limit key .*refused$/);
  const long = await get(`${url}/`, { 'X-User': 'x'.repeat(300) });
  assert.deepStrictEqual([long.status, long.body], [400, { error: 'rate-limit key too long' }]);
  const longest = 'y'.repeat(200 - prefix.length - 1);   // a 200-byte bucket name passes
  assert.strictEqual((await get(`${url}/`, { 'X-User': longest })).status, 200);
});

test('fail closed: 503 with Retry-After when the database cannot answer', async (t) => {
  const pool = new Pool({ host: '/nonexistent', port: 1, max: 1, connectionTimeoutMillis: 2000 });
  const logged = [];
  const { server, url } = await serve(withRateLimit(pool, { rate: 1, per: 1, log: (m) => logged.push(m) },
                                                    (req, res) => { res.end('passed'); }));
  t.after(async () => { server.closeAllConnections(); server.close(); await pool.end(); });
  const r = await get(url, { 'X-Api-Key': 'k' });
  assert.deepStrictEqual([r.status, r.retryAfter, r.body], [503, '1', { error: 'rate limit unavailable' }]);
  assert.match(logged[0], /^rate limit check failed: /);
  assert.throws(() => rateLimit(pool, { rate: 0, per: 1 }), RangeError);
});

// An http server (testkit/rl_child.js) on withRateLimit in a process of its own: a crash there
// does not take the test runner down.
async function child(t) {
  const c = fork(path.join(__dirname, '..', 'testkit', 'rl_child.js'), [], { stdio: ['ignore', 'ignore', 'pipe', 'ipc'] });
  c.stderrText = '';
  c.stderr.on('data', (d) => { c.stderrText += d; });
  t.after(() => { if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL'); });
  const { port } = await new Promise((r) => c.once('message', r));
  return { c, url: `http://127.0.0.1:${port}` };
}

async function status(url, headers) {
  try {
    return (await fetch(url, { headers })).status;
  } catch (err) {
    return `no answer (${err.cause ? err.cause.code : err.message})`;
  }
}

test('a key function that throws: 500 for that request, the server process lives on', async (t) => {
  const { c, url } = await child(t);
  assert.strictEqual(await status(url, {}), 200);
  const first = await status(url, { 'x-boom': '1' });
  await new Promise((r) => setTimeout(r, 200));
  const after = await status(url, {});
  assert.deepStrictEqual([first, after, c.exitCode], [500, 200, null], c.stderrText.split('\n').slice(0, 3).join(' / '));
  assert.match(c.stderrText, /GET \/: internal error: no user on this request/);
});

test('a key function that returns a number (a user id): its decimal text is the key', async (t) => {
  const { c, url } = await child(t);
  const answers = [];
  for (let i = 0; i < 2; i++) answers.push(await status(url, { 'x-num': '1' }));
  const after = await status(url, {});
  assert.deepStrictEqual([...answers, after, c.exitCode], [200, 200, 200, null], c.stderrText.split('\n').slice(0, 3).join(' / '));
});

test('Express style: a key or cost function that throws or answers nonsense goes to next(err)', async () => {
  const db = { query: async () => assert.fail('no query for a request in error') };
  const res = { writeHead() { assert.fail('answered'); }, end() {}, setHeader() {} };
  const req = { method: 'GET', url: '/', headers: {}, socket: {} };
  for (const [options, pattern] of [
    [{ key: () => { throw new Error('no user'); } }, /no user/],
    [{ key: () => ({ id: 1 }) }, /key function returned object/],
    [{ key: () => 'k', cost: () => 11 }, /cost\(req\) must be an integer from 0 to burst \(10\), not 11/],
    [{ key: () => 'k', cost: () => { throw new Error('cost bug'); } }, /cost bug/],
  ]) {
    const got = [];
    await rateLimit(db, { rate: 10, per: 1, ...options })(req, res, (err) => got.push(err));
    assert.strictEqual(got.length, 1);
    assert.match(String(got[0] && got[0].message), pattern);
  }
});

test('a cost take would always refuse (above burst, fractional, negative) is refused at construction', () => {
  const db = { query: async () => ({ rows: [] }) };
  for (const opts of [{ rate: 10, per: 1, burst: 5, cost: 6 }, { rate: 10, per: 1, cost: 1.5 },
                      { rate: 10, per: 1, cost: -1 }, { rate: 10, per: 1, cost: '1' },
                      { rate: 2 ** 31, per: 1 }, { rate: 1, per: 1, burst: 2 ** 31 }]) {
    assert.throws(() => rateLimit(db, opts), RangeError, JSON.stringify(opts));
  }
  assert.strictEqual(typeof rateLimit(db, { rate: 10, per: 1, burst: 5, cost: 5 }), 'function');
  assert.strictEqual(typeof rateLimit(db, { rate: 10, per: 1, cost: 0 }), 'function');
});
