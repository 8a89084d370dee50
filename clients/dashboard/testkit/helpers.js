'use strict';
// What the dashboard's tests share: a database of their own (made and dropped
// per test file, so that a run leaves nothing and runs again anywhere), roles
// of their own made from the least-privilege recipe of docs/security.md and
// the grants of docs/dashboard.md as written, the data the pages show, and
// plain HTTP requests.
const crypto = require('node:crypto');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const pg = require('pg');

const { createDashboard } = require('../lib/server');

const ROOT = path.join(__dirname, '..', '..', '..');

// The ```sql block of `doc` holding `mark`.
function sqlBlock(doc, mark) {
  const lines = fs.readFileSync(path.join(ROOT, 'docs', doc), 'utf8').split('\n');
  for (let i = 0; i < lines.length; i += 1) {
    if (lines[i].trim() !== '```sql') continue;
    const end = lines.findIndex((l, j) => j > i && l.trim() === '```');
    const block = lines.slice(i + 1, end).join('\n');
    if (block.includes(mark)) return `${block}\n`;
  }
  throw new Error(`docs/${doc} has no SQL block holding ${JSON.stringify(mark)}`);
}

function connectionUrl({ user, password, database }) {
  const host = process.env.PGHOST || 'localhost';
  const port = process.env.PGPORT || '5432';
  const auth = `${encodeURIComponent(user)}:${encodeURIComponent(password)}`;
  if (host.startsWith('/')) {
    return `postgresql://${auth}@/${encodeURIComponent(database)}?host=${encodeURIComponent(host)}&port=${port}`;
  }
  return `postgresql://${auth}@${host.includes(':') ? `[${host}]` : host}:${port}/${encodeURIComponent(database)}`;
}

async function client(database) {
  const c = new pg.Client(database ? { database } : {});
  await c.connect();
  return c;
}

// Makes the database (pg_throttle in it, nothing revoked yet) and the roles:
// ro (docs/security.md's monitoring role), op (docs/dashboard.md's
// dashboard_operator), app (the recipe's app_rw) and none (granted nothing). `setup.grant()` runs the
// recipe and the dashboard's grants; `setup.drop()` drops it all.
async function createSetup({ extension = true } = {}) {
  const suffix = `${process.pid}_${crypto.randomBytes(4).toString('hex')}`;
  const database = `pgt_dash_${suffix}`;
  const roles = {
    ro: `pgt_dash_ro_${suffix}`, op: `pgt_dash_op_${suffix}`, app: `pgt_dash_app_${suffix}`, none: `pgt_dash_no_${suffix}`,
  };
  const password = crypto.randomBytes(12).toString('hex');
  const admin = await client();
  await admin.query(`CREATE DATABASE ${database}`);
  for (const role of Object.values(roles)) await admin.query(`CREATE ROLE ${role} LOGIN PASSWORD '${password}'`);
  const setup = {
    database,
    roles,
    db: null,
    url: (role) => connectionUrl({ user: role, password, database }),
    adminUrl: null,
    async install() {
      await this.db.query('CREATE EXTENSION pg_throttle');
    },
    async grant() {
      const rename = (sql) => sql.replace(/\bmonitoring\b/g, roles.ro)
        .replace(/\bdashboard_operator\b/g, roles.op).replace(/\bapp_rw\b/g, roles.app);
      await this.db.query(rename(sqlBlock('security.md', 'REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA throttle FROM PUBLIC')));
      await this.db.query(rename(sqlBlock('dashboard.md', 'GRANT monitoring TO dashboard_operator')));
    },
    async drop() {
      if (this.db) {
        // The registry is the server's, not the database's: what the test
        // left there (group leases, locks, buckets) is cleared first.
        await this.db.query(`
          SELECT throttle.release_group(queue, group_key)
            FROM (SELECT DISTINCT queue, group_key FROM throttle.event
                   WHERE state = 'claimed' AND group_key IS NOT NULL) g;
          SELECT throttle.reset(name) FROM (SELECT DISTINCT name FROM throttle.status WHERE kind <> 'group') s;`)
          .catch(() => {});
        await this.db.end().catch(() => {});
      }
      await admin.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
      for (const role of [roles.op, roles.ro, roles.app, roles.none]) await admin.query(`DROP ROLE IF EXISTS ${role}`);
      await admin.end();
    },
  };
  setup.db = await client(database);
  if (extension) await setup.install();
  return setup;
}

// The data the pages show, as an application and its workers would leave it:
// queues with due and scheduled events, a group held by a worker, dead events
// whose errors hold markup, a paused queue, a recurring schedule, a lock and a
// bucket with grants and denials. Returns the dead events' ids by item_key.
async function seed(db) {
  await db.query(`
    SELECT throttle.schedule('mail', 'welcome:' || g, now() - make_interval(secs => 90 + g))
      FROM generate_series(1, 4) g;
    SELECT throttle.schedule('mail', 'digest:' || g, now() + make_interval(hours => g))
      FROM generate_series(1, 3) g;
    SELECT throttle.schedule('orders', 'order:' || g, now() - interval '30 seconds', group_key => 'customer:42')
      FROM generate_series(1, 3) g;
    SELECT throttle.schedule('orders', 'order:9', now() + interval '2 minutes', group_key => 'customer:7');
    SELECT count(*) FROM throttle.claim_group('orders', 'worker-7', lease => '10 minutes');
    SELECT throttle.schedule('webhooks', 'hook:' || g, now() - interval '2 minutes', max_attempts => 1)
      FROM generate_series(1, 3) g;
    SELECT throttle.schedule('webhooks', 'hook:ok', now() - interval '1 minute', max_attempts => 3);
    SELECT throttle.fail(ARRAY[id], claim_token,
             CASE item_key
               WHEN 'hook:1' THEN 'HTTP 502 from https://hooks.example.com/<script>window.pwned = 1</script>'
               WHEN 'hook:2' THEN 'timeout after 30 s <img src=x onerror="window.pwned = 2">'
               ELSE 'connection refused' END)
      FROM throttle.claim('webhooks', 'host-2', max => 10) WHERE item_key <> 'hook:ok';
    SELECT throttle.schedule('reports', 'monthly:2026-11', now() + interval '1 day');
    SELECT throttle.pause('reports');
    INSERT INTO throttle.recurring (name, queue, cron, time_zone)
      VALUES ('nightly-report', 'reports', '0 3 * * *', 'Europe/Paris');
    SELECT throttle.lock('billing:nightly', '15 minutes', holder => 'cron@host-1');
    SELECT (throttle.take('api:42', 2, '1 minute')).allowed FROM generate_series(1, 5);`);
  const { rows } = await db.query("SELECT item_key, id::text AS id FROM throttle.dead_events WHERE queue = 'webhooks'");
  return Object.fromEntries(rows.map((r) => [r.item_key, r.id]));
}

async function start(setup, role, options = {}) {
  // role null: the libpq environment's role (a superuser in CI).
  const where = role ? { connectionString: setup.url(role) } : { connection: { database: setup.database } };
  return createDashboard({ ...where, port: 0, ...options });
}

// One HTTP request to the dashboard; Host is the dashboard's own unless given,
// and X-PGTD-Read: 1 is sent as the page sends it (a header given as null is
// left out).
function request(dash, { method = 'GET', path: p = '/', headers = {}, body } = {}) {
  const all = { Host: `127.0.0.1:${dash.port}`, 'X-PGTD-Read': '1', ...headers };
  for (const [k, v] of Object.entries(all)) if (v === null) delete all[k];
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1', port: dash.port, method, path: p, headers: all,
    }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json;
        try {
          json = JSON.parse(text);
        } catch {
          json = undefined;
        }
        resolve({ status: res.statusCode, headers: res.headers, text, json });
      });
    });
    req.on('error', reject);
    if (body !== undefined) req.write(body);
    req.end();
  });
}

// The headers of an action a page of the dashboard sends.
function actionHeaders(dash, extra = {}) {
  return {
    'Content-Type': 'application/json',
    Origin: `http://127.0.0.1:${dash.port}`,
    Cookie: `${dash.guard.cookieName}=${dash.guard.token}`,
    'X-CSRF-Token': dash.guard.token,
    ...extra,
  };
}

function post(dash, action, value, headers) {
  return request(dash, {
    method: 'POST', path: `/api/actions/${action}`, headers: headers || actionHeaders(dash),
    body: typeof value === 'string' ? value : JSON.stringify(value),
  });
}

async function one(db, sql, params) {
  return (await db.query(sql, params)).rows[0];
}

module.exports = { createSetup, seed, start, request, post, actionHeaders, one, sqlBlock, connectionUrl, ROOT };
