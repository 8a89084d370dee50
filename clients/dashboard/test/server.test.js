'use strict';
// The server, with plain HTTP requests against a live database: the numbers
// of each endpoint are the views' rows read directly; the roles' permissions
// and refusals; the cross-site checks; bad input.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const net = require('node:net');
const path = require('node:path');
const readline = require('node:readline');

const { createSetup, seed, start, request, post, actionHeaders, one } = require('../testkit/helpers');
const { createDashboard, VersionError } = require('../lib/server');

const BIN = path.join(__dirname, '..', 'bin', 'pg-throttle-dashboard.js');

let setup;
let dead; // item_key -> id of the seeded dead events
let admin; // the superuser's dashboard (the libpq environment's role)
let ro; // the read-only role's
let op; // the operator's
let missing; // what the command did with a database without pg_throttle

// Runs the command; resolves with its first stdout line (or null), its exit
// code when it exits by itself, and the process (still running or not).
function runBin(args) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (c) => { stderr += c; });
    const lines = readline.createInterface({ input: child.stdout });
    let settled = false;
    lines.once('line', (line) => {
      if (!settled) {
        settled = true;
        resolve({ line, child, stderr: () => stderr });
      }
    });
    child.on('exit', (code) => {
      if (!settled) {
        settled = true;
        resolve({ line: null, code, child, stderr: () => stderr });
      }
    });
  });
}

before(async () => {
  setup = await createSetup({ extension: false });
  missing = await runBin(['--database', setup.url(setup.roles.op), '--port', '0']);
  await setup.install();
  dead = await seed(setup.db);
  await setup.grant();
  admin = await start(setup, null);
  ro = await start(setup, setup.roles.ro);
  op = await start(setup, setup.roles.op);
});

after(async () => {
  for (const dash of [admin, ro, op]) if (dash) await dash.close();
  if (setup) await setup.drop();
});

async function overview(dash) {
  const res = await request(dash, { path: '/api/overview' });
  assert.equal(res.status, 200, res.text);
  return res.json;
}

test('the command refuses a database without pg_throttle: a clear message and exit status 2', () => {
  assert.equal(missing.line, null);
  assert.equal(missing.code, 2);
  assert.match(missing.stderr(), /pg_throttle is not installed in database "pgt_dash_/);
});

test('the command refuses bad arguments with exit status 2', async () => {
  for (const args of [['--port', 'abc'], ['--port', '70000'], ['--bogus'], ['--allow-host', 'a b'], ['--allow-host', 'x:99999']]) {
    const run = await runBin([...args, '--database', setup.url(setup.roles.ro), ...(args[0] === '--port' ? [] : ['--port', '0'])]);
    assert.equal(run.line, null, args.join(' '));
    assert.equal(run.code, 2, args.join(' '));
    assert.match(run.stderr(), /^pg-throttle-dashboard: (--port|Unknown option|allowed host)/);
  }
});

test('a version the dashboard does not support is refused with a VersionError', async () => {
  await assert.rejects(createDashboard({ connection: { database: setup.database }, port: 0, supported: ['9.9.9'] }),
    (e) => e instanceof VersionError && e.code === 'PG_THROTTLE_VERSION' && /pg_throttle 0\.4\.0 is installed.*supports 9\.9\.9/.test(e.message));
});

test('the command prints the URL it listens on first, serves the page, and stops on SIGTERM', async () => {
  const run = await runBin(['--database', setup.url(setup.roles.ro), '--port', '0']);
  assert.match(run.line || '', /^listening on http:\/\/127\.0\.0\.1:[0-9]+\/$/, run.stderr());
  const port = Number(/:([0-9]+)\/$/.exec(run.line)[1]);
  const page = await request({ port }, { path: '/' });
  assert.equal(page.status, 200);
  assert.match(page.headers['content-type'], /^text\/html/);
  assert.match(page.text, /<script src="\/app\.js" defer><\/script>/);
  assert.match(String(page.headers['set-cookie']), new RegExp(`^pgtd_csrf_${port}=[A-Za-z0-9_-]{43}; Path=/; SameSite=Strict$`));
  assert.match(page.headers['content-security-policy'], /script-src 'self'/);
  const exited = new Promise((resolve) => run.child.on('exit', (code) => resolve(code)));
  run.child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

test('queues: the numbers of throttle.queue_metrics', async () => {
  const api = await overview(ro);
  const view = (await setup.db.query('SELECT * FROM throttle.queue_metrics ORDER BY queue')).rows;
  assert.deepEqual(api.queues.rows.map((r) => r.queue), view.map((r) => r.queue));
  assert.deepEqual(api.queues.rows.map((r) => r.queue), ['mail', 'orders', 'reports', 'webhooks']);
  for (const [i, r] of view.entries()) {
    const a = api.queues.rows[i];
    for (const k of ['due', 'scheduled', 'claimed', 'claims_expired', 'dead', 'paused_groups']) {
      assert.equal(a[k], Number(r[k]), `${r.queue}.${k}`);
    }
    assert.equal(a.paused, r.paused);
    assert.ok(Math.abs(a.oldest_due_seconds - r.oldest_due_seconds) < 5, `${r.queue}.oldest_due_seconds`);
  }
  const mail = api.queues.rows.find((r) => r.queue === 'mail');
  assert.deepEqual([mail.due, mail.scheduled, mail.claimed], [4, 3, 0]);
  assert.ok(mail.oldest_due_seconds >= 90);
  assert.equal(api.queues.rows.find((r) => r.queue === 'reports').paused, true);
  assert.deepEqual((await request(ro, { path: '/api/queues' })).json.rows.map((r) => r.dead), view.map((r) => Number(r.dead)));
});

test('groups held, dead events, pending events: the rows of the event views', async () => {
  const api = await overview(ro);
  assert.equal(api.permissions.event_source, 'throttle.all_events');
  const groups = (await setup.db.query(
    `SELECT queue, group_key, claimed_by, count(*)::int AS events, max(lease_until) AS lease_until
       FROM throttle.all_events WHERE state = 'claimed' AND group_key IS NOT NULL
      GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`)).rows;
  assert.deepEqual(api.groups.rows.map((r) => [r.queue, r.group_key, r.claimed_by, r.events, r.lease_until]),
    groups.map((r) => [r.queue, r.group_key, r.claimed_by, r.events, r.lease_until.toISOString()]));
  assert.deepEqual(api.groups.rows.map((r) => [r.group_key, r.claimed_by, r.events]), [['customer:42', 'worker-7', 3]]);

  const deadRows = (await setup.db.query(
    'SELECT id::text, queue, item_key, attempts, last_error, completed_at FROM throttle.dead_events ORDER BY completed_at DESC, id DESC')).rows;
  assert.deepEqual(api.dead.rows.map((r) => [r.id, r.queue, r.item_key, r.attempts, r.last_error, r.died_at]),
    deadRows.map((r) => [r.id, r.queue, r.item_key, r.attempts, r.last_error, r.completed_at.toISOString()]));
  assert.equal(api.dead.total, 3);
  assert.match(api.dead.rows.find((r) => r.item_key === 'hook:1').last_error, /<script>window\.pwned = 1<\/script>/);

  const pending = (await setup.db.query(
    "SELECT id::text FROM throttle.all_events WHERE state = 'pending' ORDER BY run_at, id")).rows;
  assert.deepEqual(api.pending.rows.map((r) => r.id), pending.map((r) => r.id));
  // The superuser reads throttle.event itself: the same rows.
  const su = await overview(admin);
  assert.equal(su.permissions.event_source, 'throttle.event');
  assert.deepEqual(su.groups.rows, api.groups.rows);
  assert.deepEqual(su.pending.rows, api.pending.rows);
});

test('recurring schedules, pauses, locks: the views\' rows', async () => {
  const api = await overview(ro);
  const rec = (await setup.db.query('SELECT name, queue, cron, time_zone, enabled, next_firing, last_firing FROM throttle.recurring_status ORDER BY name')).rows;
  assert.deepEqual(api.recurring.rows.map((r) => [r.name, r.queue, r.cron, r.time_zone, r.enabled, r.next_firing, r.last_firing]),
    rec.map((r) => [r.name, r.queue, r.cron, r.time_zone, r.enabled, r.next_firing.toISOString(), r.last_firing]));
  assert.equal(api.recurring.rows[0].name, 'nightly-report');

  const pauses = (await setup.db.query('SELECT queue, group_key, paused_by FROM throttle.queue_pause ORDER BY queue')).rows;
  assert.deepEqual(api.pauses.rows.map((r) => [r.queue, r.group_key, r.paused_by]), pauses.map((r) => [r.queue, r.group_key, r.paused_by]));

  const locks = (await setup.db.query('SELECT name, owner::text, holder, holder_pid, expires_at, session, waiters FROM throttle.locks ORDER BY name')).rows;
  assert.deepEqual(api.locks.rows.map((r) => [r.name, r.owner, r.holder, r.holder_pid, r.expires_at, r.session, r.waiters]),
    locks.map((r) => [r.name, r.owner, r.holder, r.holder_pid, r.expires_at.toISOString(), r.session, r.waiters]));
  assert.deepEqual(api.locks.rows.map((r) => [r.name, r.holder]), [['billing:nightly', 'cron@host-1']]);
  assert.equal('token' in api.locks.rows[0], false, 'no fence token on the page');
});

test('registry: entries against capacity, quota use, and grants and denials per second from two samples', async () => {
  // A dashboard of its own, so that the samples are this test's: one at start.
  const dash = await start(setup, setup.roles.ro);
  try {
    const first = (await request(dash, { path: '/api/registry' })).json;
    const view = (await setup.db.query('SELECT kind, entries, capacity FROM throttle.registry_metrics ORDER BY kind')).rows;
    assert.deepEqual(first.metrics.rows.map((r) => [r.kind, r.capacity]), view.map((r) => [r.kind, Number(r.capacity)]));
    assert.deepEqual(first.metrics.rows.map((r) => r.kind), ['bucket', 'group', 'group_bucket', 'lock', 'queue_bucket', 'resource']);
    // Read within a second of the start: one sample, no rate yet.
    assert.ok(first.metrics.rows.every((r) => r.grants_per_second === null));
    const bucket0 = first.metrics.rows.find((r) => r.kind === 'bucket');
    assert.ok(bucket0.grants >= 2 && bucket0.denials >= 3, JSON.stringify(bucket0));

    await setup.db.query("SELECT (throttle.take('api:rates', 3, '1 hour')).allowed FROM generate_series(1, 10)");
    await new Promise((r) => setTimeout(r, 1100));
    const second = (await request(dash, { path: '/api/registry' })).json;
    const bucket = second.metrics.rows.find((r) => r.kind === 'bucket');
    assert.ok(bucket.grants - bucket0.grants >= 3);
    assert.ok(bucket.denials - bucket0.denials >= 7);
    assert.ok(bucket.rate_over_seconds >= 1 && bucket.rate_over_seconds < 5, String(bucket.rate_over_seconds));
    // Over the samples (the first one at start, before the first read): at least these.
    assert.ok(bucket.grants_per_second * bucket.rate_over_seconds >= 3 - 1e-9, JSON.stringify(bucket));
    assert.ok(bucket.denials_per_second * bucket.rate_over_seconds >= 7 - 1e-9, JSON.stringify(bucket));

    const usage = (await setup.db.query(`SET ROLE ${setup.roles.ro}; SELECT scope, name, entries, quota FROM throttle.registry_usage() ORDER BY scope, name; RESET ROLE`))[1].rows;
    assert.deepEqual(second.usage.rows.map((r) => [r.scope, r.name, r.entries, r.quota]),
      usage.map((r) => [r.scope, r.name, Number(r.entries), r.quota === null ? null : Number(r.quota)]));
    assert.ok(second.usage.rows.some((r) => r.scope === 'database' && r.name === setup.database));
    const status = (await setup.db.query('SELECT kind, count(*)::int AS n FROM throttle.status GROUP BY kind ORDER BY kind')).rows;
    assert.deepEqual(second.database.rows.map((r) => [r.kind, r.entries]), status.map((r) => [r.kind, r.n]));
  } finally {
    await dash.close();
  }
});

test('a role without pg_monitor: the registry\'s server-wide table says 42501, the rest reads', async () => {
  const res = await request(op, { path: '/api/overview' });
  assert.equal(res.status, 200);
  // op is a member of ro, which has pg_monitor: it reads registry_metrics too.
  assert.ok(res.json.registry.metrics.rows);
  await setup.db.query(`REVOKE pg_monitor FROM ${setup.roles.ro}`);
  try {
    const without = await overview(ro);
    assert.equal(without.registry.metrics.error.code, '42501');
    assert.ok(without.registry.usage.rows && without.queues.rows.length === 4);
    assert.equal((await request(ro, { path: '/api/registry' })).status, 200);
  } finally {
    await setup.db.query(`GRANT pg_monitor TO ${setup.roles.ro}`);
  }
});

test('permissions: the read-only role may take no action, the operator and the superuser every one', async () => {
  const all = await overview(ro);
  assert.equal(all.csrf_cookie, `pgtd_csrf_${ro.port}`, 'the cookie\'s name, for the page');
  assert.equal(JSON.stringify(all).includes(ro.guard.token), false, 'never the token');
  const roPerm = (await request(ro, { path: '/api/permissions' })).json;
  assert.equal(roPerm.role, setup.roles.ro);
  assert.deepEqual(roPerm.actions, { retry: false, cancel: false, pause: false, resume: false });
  const opPerm = (await request(op, { path: '/api/permissions' })).json;
  assert.deepEqual(opPerm.actions, { retry: true, cancel: true, pause: true, resume: true });
  assert.deepEqual((await request(admin, { path: '/api/permissions' })).json.actions, { retry: true, cancel: true, pause: true, resume: true });
  // The application role of the recipe may retry and cancel, not pause.
  const app = await start(setup, setup.roles.app);
  try {
    assert.deepEqual((await request(app, { path: '/api/permissions' })).json.actions, { retry: true, cancel: true, pause: false, resume: false });
  } finally {
    await app.close();
  }
});

test('a role granted nothing: every section says 42501, no action, and the server goes on', async () => {
  const none = await start(setup, setup.roles.none);
  try {
    const api = await overview(none);
    assert.equal(api.permissions.schema_usage, false);
    assert.deepEqual(api.permissions.actions, { retry: false, cancel: false, pause: false, resume: false });
    for (const section of ['queues', 'pauses', 'groups', 'dead', 'pending', 'recurring', 'locks']) {
      assert.equal(api[section].error.code, '42501', section);
    }
    assert.equal(api.registry.metrics.error.code, '42501');
    assert.equal((await request(none, { path: '/api/queues' })).status, 403);
    const res = await post(none, 'pause', { queue: 'mail' });
    assert.equal(res.status, 403);
    assert.match(res.json.error, /permission denied for schema throttle/);
  } finally {
    await none.close();
  }
});

test('the read-only role: every action is refused by the database (403, 42501), nothing changes', async () => {
  const digest1 = (await one(setup.db, "SELECT id::text FROM throttle.event WHERE queue = 'mail' AND item_key = 'digest:1'")).id;
  for (const [action, body] of [
    ['retry', { id: dead['hook:3'] }],
    ['cancel', { id: digest1, queue: 'mail', item_key: 'digest:1' }],
    ['pause', { queue: 'mail' }],
    ['resume', { queue: 'reports' }],
  ]) {
    const res = await post(ro, action, body);
    assert.equal(res.status, 403, `${action}: ${res.text}`);
    assert.equal(res.json.code, '42501');
    assert.match(res.json.error, new RegExp(`permission denied for function ${action}`));
  }
  assert.equal((await one(setup.db, 'SELECT state FROM throttle.event WHERE id = $1', [dead['hook:3']])).state, 'dead');
  assert.equal((await one(setup.db, "SELECT count(*)::int AS n FROM throttle.event WHERE queue = 'mail' AND item_key = 'digest:1' AND state = 'pending'")).n, 1);
  assert.deepEqual((await setup.db.query('SELECT queue FROM throttle.queue_pause')).rows, [{ queue: 'reports' }]);
});

test('the operator: retry, cancel, pause and resume work, and say why when they change nothing', async () => {
  let res = await post(op, 'retry', { id: dead['hook:3'] });
  assert.equal(res.status, 200, res.text);
  assert.deepEqual(res.json, { ok: true, message: `event ${dead['hook:3']} is pending again, due now` });
  const row = await one(setup.db, 'SELECT state, attempts, run_at <= now() AS due FROM throttle.event WHERE id = $1', [dead['hook:3']]);
  assert.deepEqual(row, { state: 'pending', attempts: 0, due: true });
  res = await post(op, 'retry', { id: dead['hook:3'] });
  assert.equal(res.status, 409);
  assert.equal(res.json.error, `event ${dead['hook:3']} is pending, not dead`);
  res = await post(op, 'retry', { id: '987654321' });
  assert.equal(res.status, 404);
  assert.equal(res.json.error, 'no event 987654321');

  // Cancel names the event the page's row shows (its id, with its queue and item_key).
  const idOf = async (queue, key) => (await one(setup.db, 'SELECT id::text FROM throttle.event WHERE queue = $1 AND item_key = $2', [queue, key])).id;
  const digest3 = await idOf('mail', 'digest:3');
  res = await post(op, 'cancel', { id: digest3, queue: 'mail', item_key: 'digest:3' });
  assert.equal(res.status, 200, res.text);
  assert.equal((await one(setup.db, "SELECT state FROM throttle.all_events WHERE queue = 'mail' AND item_key = 'digest:3'")).state, 'cancelled');
  res = await post(op, 'cancel', { id: digest3, queue: 'mail', item_key: 'digest:3' });
  assert.equal(res.status, 409);
  assert.equal(res.json.error, `event ${digest3} is cancelled, not pending: nothing was cancelled (reload the page)`);
  res = await post(op, 'cancel', { id: '987654321', queue: 'mail', item_key: 'nothing-like-it' });
  assert.equal(res.status, 404);
  assert.equal(res.json.error, 'no event 987654321');
  res = await post(op, 'cancel', { id: await idOf('orders', 'order:1'), queue: 'orders', item_key: 'order:1' });
  assert.equal(res.status, 409);
  assert.match(res.json.error, /is claimed by 'worker-7'/);
  res = await post(op, 'cancel', { id: await idOf('mail', 'digest:2'), queue: 'mail', item_key: 'digest:1' });
  assert.equal(res.status, 409, 'an id of another item_key');
  assert.match(res.json.error, /is not "digest:1" of queue "mail"/);
  assert.equal((await one(setup.db, "SELECT count(*)::int AS n FROM throttle.event WHERE queue = 'mail' AND item_key IN ('digest:1', 'digest:2') AND state = 'pending'")).n, 2);

  res = await post(op, 'pause', { queue: 'mail' });
  assert.equal(res.status, 200, res.text);
  assert.equal((await one(setup.db, "SELECT paused_by FROM throttle.queue_pause WHERE queue = 'mail'")).paused_by.split(' ')[0], setup.roles.op);
  assert.equal((await overview(ro)).queues.rows.find((r) => r.queue === 'mail').paused, true);
  res = await post(op, 'pause', { queue: 'mail' });
  assert.equal(res.status, 409);
  assert.match(res.json.error, /queue 'mail' is already paused/);
  res = await post(op, 'resume', { queue: 'mail' });
  assert.equal(res.status, 200);
  res = await post(op, 'resume', { queue: 'mail' });
  assert.equal(res.status, 409);
  assert.match(res.json.error, /queue 'mail' is not paused/);
  res = await post(op, 'pause', { queue: 'orders', group_key: 'customer:7' });
  assert.equal(res.status, 200);
  assert.equal((await one(setup.db, "SELECT count(*)::int AS n FROM throttle.queue_pause WHERE queue = 'orders' AND group_key = 'customer:7'")).n, 1);
  res = await post(op, 'resume', { queue: 'orders', group_key: 'customer:7' });
  assert.equal(res.status, 200);
  assert.equal((await one(setup.db, "SELECT count(*)::int AS n FROM throttle.queue_pause WHERE queue = 'orders'")).n, 0);
});

test('cross-site requests are refused with 403 and change nothing', async () => {
  const body = { queue: 'mail' };
  const cases = [
    ['no token', actionHeaders(op, { 'X-CSRF-Token': undefined, Cookie: undefined })],
    ['the token header without the cookie', actionHeaders(op, { Cookie: undefined })],
    ['the cookie without the header', actionHeaders(op, { 'X-CSRF-Token': undefined })],
    ['a wrong token', actionHeaders(op, { 'X-CSRF-Token': 'x'.repeat(43), Cookie: `${op.guard.cookieName}=${'x'.repeat(43)}` })],
    ['a header that differs from the cookie', actionHeaders(op, { Cookie: `${op.guard.cookieName}=${'y'.repeat(43)}` })],
    ['another dashboard\'s token', actionHeaders(op, { 'X-CSRF-Token': ro.guard.token, Cookie: `${op.guard.cookieName}=${ro.guard.token}` })],
    ['a foreign Origin', actionHeaders(op, { Origin: 'http://evil.example' })],
    ['the Origin of another port', actionHeaders(op, { Origin: `http://127.0.0.1:${op.port + 1}` })],
    ['Origin null', actionHeaders(op, { Origin: 'null' })],
    ['Sec-Fetch-Site cross-site', actionHeaders(op, { 'Sec-Fetch-Site': 'cross-site' })],
    ['Sec-Fetch-Site same-site', actionHeaders(op, { 'Sec-Fetch-Site': 'same-site' })],
    ['a foreign Host (DNS rebinding)', actionHeaders(op, { Host: `evil.example:${op.port}`, Origin: `http://evil.example:${op.port}` })],
  ];
  for (const [what, headers] of cases) {
    for (const k of Object.keys(headers)) if (headers[k] === undefined) delete headers[k];
    const res = await post(op, 'pause', body, headers);
    assert.equal(res.status, 403, `${what}: ${res.text}`);
    assert.equal(res.json.ok, false);
  }
  // A form's body (text/plain) is not JSON: refused before it is read.
  const form = await post(op, 'pause', '{"queue": "mail"}', actionHeaders(op, { 'Content-Type': 'text/plain' }));
  assert.equal(form.status, 415);
  assert.equal((await one(setup.db, "SELECT count(*)::int AS n FROM throttle.queue_pause WHERE queue = 'mail'")).n, 0);
  // GET never acts.
  const get = await request(op, { path: '/api/actions/pause?queue=mail' });
  assert.equal(get.status, 405);

  // The Host header must name this server, for every request.
  for (const host of [`evil.example:${op.port}`, 'localhost', `127.0.0.1:${op.port + 1}`, 'a b', `[::1:${op.port}`]) {
    const res = await request(op, { path: '/api/overview', headers: { Host: host } });
    assert.equal(res.status, 403, `Host ${JSON.stringify(host)}: ${res.text}`);
  }
  for (const host of [`localhost:${op.port}`, `LOCALHOST:${op.port}`, `[::1]:${op.port}`]) {
    assert.equal((await request(op, { path: '/api/queues', headers: { Host: host } })).status, 200, host);
  }
  // Without Origin (curl, a script) and with the token, an action goes through.
  const headers = actionHeaders(op);
  delete headers.Origin;
  assert.equal((await post(op, 'resume', { queue: 'mail' }, headers)).status, 409);
});

test('bad input gets a clear JSON error, and the server goes on', async () => {
  const cases = [
    ['retry', '{"id": ', 400, /not JSON/],
    ['retry', '[1]', 400, /must be a JSON object/],
    ['retry', 'null', 400, /must be a JSON object/],
    ['retry', '{}', 400, /"id" must be an event id/],
    ['retry', '{"id": "abc"}', 400, /"id" must be an event id/],
    ['retry', '{"id": -1}', 400, /"id" must be an event id/],
    ['retry', '{"id": 1.5}', 400, /"id" must be an event id/],
    ['retry', '{"id": "9223372036854775808"}', 400, /"id" must be an event id/],
    ['retry', '{"id": "9223372036854775807"}', 404, /no event/],
    ['retry', '{"id": {"toString": 1}}', 400, /"id" must be an event id/],
    ['cancel', '{"queue": "mail", "item_key": "x"}', 400, /"id" must be an event id/],
    ['cancel', '{"id": "1", "queue": 42, "item_key": "x"}', 400, /"queue" must be a string/],
    ['cancel', `{"id": "1", "queue": "${'q'.repeat(64)}", "item_key": "x"}`, 400, /longer than 63 bytes/],
    ['cancel', '{"id": "1", "queue": "mail", "item_key": "a\\u0000b"}', 400, /NUL/],
    ['pause', '{"queue": ""}', 400, /queue/],
    ['pause', `{"queue": "mail", "group_key": "${'g'.repeat(1025)}"}`, 400, /longer than 1024 bytes/],
    ['pause', '{"queue": "mail", "group_key": 7}', 400, /"group_key" must be a string/],
    ['delete-everything', '{}', 404, /no action "delete-everything"/],
    ['__proto__', '{}', 404, /no action/],
    ['%E0%A4%A', '{}', 404, /no action/],
  ];
  for (const [action, body, status, message] of cases) {
    const res = await post(op, action, body);
    assert.equal(res.status, status, `${action} ${body.slice(0, 60)}: ${res.text}`);
    assert.match(res.json.error, message, `${action} ${body.slice(0, 60)}`);
  }
  // Sent in chunks (no Content-Length), then with a Content-Length: read up to the limit, or not at all.
  const body = JSON.stringify({ id: '1', pad: 'x'.repeat(1 << 20) });
  for (const headers of [actionHeaders(op), actionHeaders(op, { 'Content-Length': Buffer.byteLength(body) })]) {
    const huge = await post(op, 'retry', body, headers);
    assert.equal(huge.status, 413);
    assert.match(huge.json.error, /larger than 16384 bytes/);
  }
  for (const p of ['/api/nothing', '/api/', '/nothing', '/api/overview/../../etc/passwd']) {
    const res = await request(op, { path: p });
    assert.equal(res.status, 404, p);
  }
  // A request line whose target is no URL path, and one HTTP cannot parse.
  for (const [line, status] of [['GET http://[ HTTP/1.1', 400], ['GET / HTTP/9', 400]]) {
    const answer = await new Promise((resolve, reject) => {
      const socket = net.connect(op.port, '127.0.0.1', () => socket.end(`${line}\r\nHost: 127.0.0.1:${op.port}\r\n\r\n`));
      let text = '';
      socket.on('data', (c) => { text += c; });
      socket.on('end', () => resolve(text));
      socket.on('error', reject);
    });
    assert.match(answer, new RegExp(`^HTTP/1\\.1 ${status} `), line);
  }
  const put = await request(op, { method: 'PUT', path: '/api/overview' });
  assert.equal(put.status, 405);
  assert.equal((await request(op, { path: '/api/overview' })).status, 200);
});

test('connections the server ends are replaced: the dashboard answers again', async () => {
  assert.equal((await request(ro, { path: '/api/queues' })).status, 200);
  const ended = await one(setup.db,
    `SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
      WHERE datname = current_database() AND application_name = 'pg-throttle-dashboard' AND usename = $1`, [setup.roles.ro]);
  assert.ok(ended.n >= 1);
  await new Promise((r) => setTimeout(r, 100));
  // A request may meet a connection ended under it (503, JSON); the next one reconnects.
  const first = await request(ro, { path: '/api/overview' });
  assert.ok([200, 503].includes(first.status), first.text);
  assert.ok(first.json);
  assert.equal((await request(ro, { path: '/api/overview' })).status, 200);
});
