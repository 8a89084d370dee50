'use strict';
// The defects of the dashboard's review (branch rev-dash), each a test that
// failed before its fix: the order of dead and pending events, a stale Cancel,
// reads made from another site, the clock of the 'due' and 'lease ended'
// columns, the plan of the dead events' query, the bind warning, and a prompt
// SIGTERM with requests in flight.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const http = require('node:http');
const path = require('node:path');
const readline = require('node:readline');
const pg = require('pg');

const { createSetup, start, request, post } = require('../testkit/helpers');
const { DEAD_SQL } = require('../lib/queries');

const BIN = path.join(__dirname, '..', 'bin', 'pg-throttle-dashboard.js');

let setup;
let admin;

before(async () => {
  setup = await createSetup();
  admin = await start(setup, null);
});

after(async () => {
  if (admin) await admin.close();
  if (setup) await setup.drop();
});

// Events that die in one statement share completed_at: the tie is broken by
// id, as a number ("9" sorted above "12" when the ORDER BY named id::text).
test('dead events: ids that tie on completed_at are ordered as numbers, not as text', async () => {
  await setup.db.query(`
    SELECT throttle.schedule('rev-dead', 'k' || g, now() - interval '1 minute', max_attempts => 1)
      FROM generate_series(1, 12) g;
    SELECT throttle.fail(array_agg(id), claim_token, 'boom')
      FROM throttle.claim('rev-dead', 'w', max => 12) GROUP BY claim_token;`);
  const expected = (await setup.db.query(
    `SELECT d.id::text AS id FROM throttle.dead_events d WHERE d.queue = 'rev-dead'
      ORDER BY d.completed_at DESC, d.id DESC`)).rows.map((r) => r.id);
  assert.equal(expected.length, 12);
  assert.ok(expected.some((id) => id.length !== expected[0].length), 'the ids cross a power of ten');
  const res = await request(admin, { path: '/api/dead' });
  assert.equal(res.status, 200, res.text);
  assert.deepEqual(res.json.rows.filter((r) => r.queue === 'rev-dead').map((r) => r.id), expected);
});

test('pending events: ids that tie on run_at are ordered as numbers, not as text', async () => {
  // Enough events that their ids cross a power of ten.
  const { n } = (await setup.db.query(
    `SELECT (power(10, length((coalesce(max(id), 0) + 1)::text)) - coalesce(max(id), 0) + 2)::int AS n
       FROM throttle.all_events`)).rows[0];
  assert.ok(n <= 100, 'a fresh database');
  await setup.db.query(`
    SELECT throttle.schedule('rev-pend', 'k' || g, '2000-01-01 00:00:00+00') FROM generate_series(1, $1::int) g;`, [n]);
  const expected = (await setup.db.query(
    `SELECT e.id::text AS id FROM throttle.event e WHERE e.queue = 'rev-pend' AND e.state = 'pending'
      ORDER BY e.run_at, e.id`)).rows.map((r) => r.id);
  const res = await request(admin, { path: '/api/pending' });
  assert.equal(res.status, 200, res.text);
  assert.deepEqual(res.json.rows.filter((r) => r.queue === 'rev-pend').map((r) => r.id), expected);
  await setup.db.query("SELECT throttle.cancel('rev-pend', item_key) FROM throttle.event WHERE queue = 'rev-pend'");
});

// The button of event A's row, after A was cancelled and its key scheduled
// again as B before the page refreshed: B stays pending.
test('cancel: a stale row never cancels another event of the same item_key', async () => {
  const a = (await setup.db.query(
    "SELECT throttle.schedule('rev-cancel', 'job', now() + interval '1 hour')::text AS id")).rows[0].id;
  await setup.db.query("SELECT throttle.cancel('rev-cancel', 'job')");
  const b = (await setup.db.query(
    "SELECT throttle.schedule('rev-cancel', 'job', now() + interval '1 hour')::text AS id")).rows[0].id;
  assert.notEqual(a, b);
  let res = await post(admin, 'cancel', { id: a, queue: 'rev-cancel', item_key: 'job' });
  assert.equal(res.status, 409, res.text);
  assert.equal(res.json.error, `event ${a} is cancelled, not pending: nothing was cancelled (reload the page)`);
  assert.equal((await setup.db.query('SELECT state FROM throttle.all_events WHERE id = $1', [b])).rows[0].state, 'pending');
  res = await post(admin, 'cancel', { id: b, queue: 'rev-cancel', item_key: 'job' });
  assert.equal(res.status, 200, res.text);
  assert.equal((await setup.db.query('SELECT state FROM throttle.all_events WHERE id = $1', [b])).rows[0].state, 'cancelled');
});

// The race itself: the event changes between the check and the cancel of one
// request. Cancel reads and cancels in one REPEATABLE READ transaction; here
// a concurrent transaction cancels A and schedules B while the dashboard's
// transaction waits on the row lock, and the dashboard's must not cancel B.
test('cancel: an event that changes during the request is not replaced by the new run of its key', async () => {
  const a = (await setup.db.query(
    "SELECT throttle.schedule('rev-race', 'job', now() + interval '1 hour')::text AS id")).rows[0].id;
  const other = new pg.Client({ database: setup.database });
  await other.connect();
  try {
    await other.query('BEGIN');
    await other.query("SELECT throttle.cancel('rev-race', 'job')");
    const b = (await other.query(
      "SELECT throttle.schedule('rev-race', 'job', now() + interval '1 hour')::text AS id")).rows[0].id;
    const pending = post(admin, 'cancel', { id: a, queue: 'rev-race', item_key: 'job' });
    // The dashboard's cancel waits on the row A that `other` deleted.
    await waitFor(async () => (await setup.db.query(
      "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'pg-throttle-dashboard' AND wait_event_type = 'Lock'")).rows[0].n > 0);
    await other.query('COMMIT');
    const res = await pending;
    assert.equal(res.status, 409, res.text);
    assert.match(res.json.error, /changed meanwhile/);
    assert.equal((await setup.db.query('SELECT state FROM throttle.all_events WHERE id = $1', [b])).rows[0].state, 'pending');
    await setup.db.query("SELECT throttle.cancel('rev-race', 'job')");
  } finally {
    await other.query('ROLLBACK').catch(() => {});
    await other.end();
  }
});

async function waitFor(check, ms = 5000) {
  const until = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > until) throw new Error('timed out waiting');
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

// Every read is a database transaction: a request without the page's header,
// or from another site, is refused before any connection is taken; the CORS
// preflight that a page of another origin needs to send the header gets 405
// without any CORS header.
test('reads from another site, or without the page\'s header, are refused without touching the database', async () => {
  let taken = 0;
  const connect = admin.pool.connect.bind(admin.pool);
  admin.pool.connect = (...args) => {
    taken += 1;
    return connect(...args);
  };
  try {
    const own = `http://127.0.0.1:${admin.port}`;
    for (const headers of [
      { 'X-PGTD-Read': null },
      { 'Sec-Fetch-Site': 'cross-site' },
      { 'Sec-Fetch-Site': 'same-site' },
      { Origin: 'http://127.0.0.1:1' },
      { Origin: 'https://evil.example', 'Sec-Fetch-Site': 'cross-site' },
    ]) {
      for (const p of ['/api/overview', '/api/dead', '/api/permissions', '/api/nothing']) {
        const res = await request(admin, { path: p, headers });
        assert.equal(res.status, 403, `${p} ${JSON.stringify(headers)}: ${res.text}`);
      }
    }
    const preflight = await request(admin, {
      method: 'OPTIONS', path: '/api/overview',
      headers: { Origin: 'http://evil.example', 'Access-Control-Request-Method': 'GET', 'Access-Control-Request-Headers': 'x-pgtd-read' },
    });
    assert.equal(preflight.status, 405);
    assert.ok(!Object.keys(preflight.headers).some((h) => h.startsWith('access-control-')), JSON.stringify(preflight.headers));
    assert.equal(taken, 0, `refused reads took ${taken} connections`);
    // The page's own reads pass.
    const res = await request(admin, { path: '/api/queues', headers: { Origin: own, 'Sec-Fetch-Site': 'same-origin' } });
    assert.equal(res.status, 200, res.text);
    assert.equal(taken, 1);
    // The page itself needs no header.
    assert.equal((await request(admin, { path: '/', headers: { 'X-PGTD-Read': null, 'Sec-Fetch-Site': 'cross-site' } })).status, 200);
  } finally {
    admin.pool.connect = connect;
  }
});

// The pending events' 'due' and the groups' 'lease ended' use the extension's
// clock, as throttle.queue_metrics does (pg_throttle.test_clock in tests).
test('due and lease ended: by throttle.now(), as queue_metrics counts', async () => {
  await setup.db.query(`
    SELECT throttle.schedule('rev-clock', 'later', now() + interval '1 hour');
    SELECT throttle.schedule('rev-clock', 'grouped', now() - interval '1 minute', group_key => 'g1');
    SELECT count(*) FROM throttle.claim_group('rev-clock', 'w-clock', lease => '10 minutes');`);
  const later = await start(setup, null, { connection: { database: setup.database, options: '-c pg_throttle.test_clock=2100-01-01T00:00:00Z' } });
  try {
    const res = await request(later, { path: '/api/overview' });
    assert.equal(res.status, 200, res.text);
    const q = res.json.queues.rows.find((r) => r.queue === 'rev-clock');
    assert.equal(q.due, 1, 'queue_metrics: due by throttle.now()');
    assert.equal(res.json.pending.rows.find((r) => r.item_key === 'later').due, true);
    assert.equal(res.json.groups.rows.find((r) => r.queue === 'rev-clock').lease_ended, true);
  } finally {
    await later.close();
    await setup.db.query(`SELECT throttle.release_group('rev-clock', 'g1'); SELECT throttle.cancel('rev-clock', 'later');`);
  }
});

// left() and length() of last_error run on the rows shown, after the sort and
// the LIMIT, not on every dead event: the Limit node's output holds the raw
// column, and the expressions are computed above it.
test('dead events: the LIMIT comes before last_error is cut and measured', async () => {
  const plan = (await setup.db.query(`EXPLAIN (VERBOSE, FORMAT JSON) ${DEAD_SQL}`)).rows[0]['QUERY PLAN'][0].Plan;
  const nodes = [];
  (function walk(node) {
    nodes.push(node);
    for (const child of node.Plans || []) walk(child);
  }(plan));
  const limit = nodes.find((n) => n['Node Type'] === 'Limit');
  assert.ok(limit, JSON.stringify(plan));
  const computes = (n) => (n.Output || []).some((o) => /"?(left|length)"?\(/.test(o));
  const at = nodes.indexOf(limit);
  for (const n of nodes.slice(at)) assert.ok(!computes(n), `${n['Node Type']} at or below the Limit computes ${n.Output}`);
  assert.ok(nodes.slice(0, at).some(computes), 'left() and length() above the Limit');
});

function runBin(args, env = process.env) {
  const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env });
  let stderr = '';
  child.stderr.on('data', (c) => { stderr += c; });
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  const line = new Promise((resolve) => {
    readline.createInterface({ input: child.stdout }).once('line', resolve);
    exited.then(() => resolve(null));
  });
  return { child, line, exited, stderr: () => stderr };
}

test('a bind to a non-loopback address warns on stderr; a loopback one does not', async () => {
  for (const [host, warns] of [['0.0.0.0', true], ['127.0.0.1', false]]) {
    const run = runBin(['--database', setup.url(setup.roles.op), '--host', host, '--port', '0']);
    assert.match(await run.line, /^listening on http:/);
    await new Promise((resolve) => setTimeout(resolve, 100));
    run.child.kill('SIGTERM');
    await run.exited;
    if (warns) assert.match(run.stderr(), /WARNING: listening on 0\.0\.0\.0, not a loopback address: .*no login.*anyone who can reach this port/);
    else assert.equal(run.stderr(), '');
  }
});

// Requests in flight (queries waiting on a lock) and requests waiting for one
// of the pool's 4 connections: SIGTERM ends them and the process at once.
test('SIGTERM with requests in flight and waiting for a connection exits promptly', async () => {
  // The libpq environment's role (a superuser), which reads throttle.queue_pause.
  const run = runBin(['--port', '0'], { ...process.env, PGDATABASE: setup.database });
  const url = new URL((await run.line).replace(/^listening on /, ''));
  const locker = new pg.Client({ database: setup.database });
  await locker.connect();
  try {
    await locker.query('BEGIN; LOCK TABLE throttle.queue_pause IN ACCESS EXCLUSIVE MODE');
    const requests = [];
    for (let i = 0; i < 7; i += 1) {
      requests.push(new Promise((resolve) => {
        const req = http.get({ host: url.hostname, port: url.port, path: '/api/pauses', headers: { 'X-PGTD-Read': '1' } }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode));
        });
        req.on('error', () => resolve('error'));
      }));
    }
    await waitFor(async () => (await setup.db.query(
      `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'`,
      [setup.database])).rows[0].n >= 4);
    const t0 = Date.now();
    run.child.kill('SIGTERM');
    await run.exited;
    const took = Date.now() - t0;
    assert.ok(took < 2000, `SIGTERM took ${took} ms`);
    for (const status of await Promise.all(requests)) assert.ok(status === 503 || status === 'error', String(status));
  } finally {
    await locker.query('ROLLBACK').catch(() => {});
    await locker.end();
    run.child.kill('SIGKILL');
  }
});
