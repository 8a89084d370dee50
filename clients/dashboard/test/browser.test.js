'use strict';
// The page in a real browser: Debian's chromium, headless, driven by
// puppeteer-core (which downloads no browser). The page loads, its numbers
// are the views', the buttons act (checked in SQL), the read-only role sees
// no button and a request forged anyway is refused, and a page of another
// origin cannot act. With DASHBOARD_SCREENSHOT=path, the operator's page is
// saved there (docs/img/dashboard.png).
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const puppeteer = require('puppeteer-core');

const { createSetup, seed, start, one, request } = require('../testkit/helpers');

const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';

let setup;
let dead;
let op;
let ro;
let browser;
const opLog = []; // the operator's dashboard's log: actions, and those refused
const problems = []; // console errors and page errors, from every page

before(async () => {
  setup = await createSetup();
  dead = await seed(setup.db);
  await setup.grant();
  op = await start(setup, setup.roles.op, { log: (line) => opLog.push(line) });
  ro = await start(setup, setup.roles.ro);
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    // Root in a container: no sandbox.
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
  });
});

after(async () => {
  if (browser) await browser.close();
  for (const dash of [op, ro]) if (dash) await dash.close();
  if (setup) await setup.drop();
});

async function open(dash) {
  const page = await browser.newPage();
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`${dash.url}: console: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`${dash.url}: page error: ${e.message}`));
  page.on('dialog', (d) => d.accept());
  await page.setViewport({ width: 1440, height: 1000 });
  await page.goto(dash.url, { waitUntil: 'load' });
  await page.waitForSelector('body[data-renders]');
  return page;
}

async function renders(page) {
  return Number(await page.$eval('body', (b) => b.getAttribute('data-renders')));
}

// Clicks the button and waits for the status line to answer and the page to
// draw the data read after the action.
async function click(page, selector) {
  const before = await renders(page);
  await page.$eval('#status', (s) => { s.textContent = ''; s.removeAttribute('data-kind'); });
  await page.click(selector);
  await page.waitForFunction((n) => Number(document.body.getAttribute('data-renders')) > n &&
    ['ok', 'error'].includes(document.getElementById('status').getAttribute('data-kind')), {}, before);
  return page.$eval('#status', (s) => ({ kind: s.getAttribute('data-kind'), text: s.textContent }));
}

// The rows of a section's (first) table: the tr's data-* attributes, and per
// column its text and data-value.
function rows(page, selector) {
  return page.$$eval(`${selector} tbody tr`, (trs) => trs.map((tr) => ({
    attrs: { ...tr.dataset },
    cols: Object.fromEntries([...tr.cells].map((td) => [td.dataset.col, { text: td.textContent, value: td.dataset.value }])),
    buttons: [...tr.querySelectorAll('button[data-action]')].map((b) => b.dataset.action),
  })));
}

function shown(iso) {
  return `${new Date(iso).toISOString().slice(0, 19).replace('T', ' ')}Z`;
}

test('the page loads and shows what the views hold, every value as text', async () => {
  const page = await open(op);
  assert.equal(await page.$eval('#database', (e) => e.textContent), setup.database);
  assert.equal(await page.$eval('#role', (e) => e.textContent), `${setup.roles.op} (may retry, cancel, pause, resume)`);
  assert.equal(await page.$eval('#extversion', (e) => e.textContent), '0.4.0');

  const queues = await rows(page, '#queues');
  const view = (await setup.db.query('SELECT * FROM throttle.queue_metrics ORDER BY queue')).rows;
  assert.deepEqual(queues.map((r) => r.attrs.queue), view.map((r) => r.queue));
  for (const [i, v] of view.entries()) {
    for (const k of ['due', 'scheduled', 'claimed', 'claims_expired', 'dead']) {
      assert.equal(queues[i].cols[k].text, String(v[k]), `${v.queue}.${k}`);
    }
    assert.equal(queues[i].cols.paused.value, String(v.paused));
    assert.deepEqual(queues[i].buttons, [v.paused ? 'resume' : 'pause']);
  }
  assert.equal(queues.find((r) => r.attrs.queue === 'mail').cols.due.text, '4');

  const deadRows = await rows(page, '#dead');
  const deadView = (await setup.db.query('SELECT d.id::text, d.item_key, d.last_error FROM throttle.dead_events d ORDER BY d.completed_at DESC, d.id DESC')).rows;
  assert.deepEqual(deadRows.map((r) => [r.attrs.id, r.cols.item_key.text, r.cols.last_error.text]),
    deadView.map((r) => [r.id, r.item_key, r.last_error]));
  assert.ok(deadRows.every((r) => r.buttons.join() === 'retry'));
  // The errors' markup is text: no element made from it, no script run.
  assert.equal(await page.$$eval('#dead script, #dead img', (n) => n.length), 0);
  assert.equal(await page.evaluate(() => window.pwned), undefined);

  const groups = await rows(page, '#groups');
  assert.deepEqual(groups.map((r) => [r.attrs.queue, r.attrs.group, r.cols.claimed_by.text, r.cols.events.text]),
    [['orders', 'customer:42', 'worker-7', '3']]);
  const recurring = await rows(page, '#recurring');
  const rec = await one(setup.db, "SELECT next_firing, cron, time_zone FROM throttle.recurring_status WHERE name = 'nightly-report'");
  assert.deepEqual(recurring.map((r) => [r.attrs.name, r.cols.cron.text, r.cols.time_zone.text, r.cols.next_firing.text]),
    [['nightly-report', rec.cron, rec.time_zone, shown(rec.next_firing)]]);
  const locks = await rows(page, '#locks');
  const lock = await one(setup.db, 'SELECT name, holder, expires_at FROM throttle.locks');
  assert.deepEqual(locks.map((r) => [r.attrs.name, r.cols.holder.text, r.cols.expires_at.text]),
    [[lock.name, lock.holder, shown(lock.expires_at)]]);
  const registry = await rows(page, '#registry-metrics');
  const metrics = (await setup.db.query('SELECT kind, capacity FROM throttle.registry_metrics ORDER BY kind')).rows;
  assert.deepEqual(registry.map((r) => [r.attrs.kind, r.cols.capacity.text]), metrics.map((m) => [m.kind, String(m.capacity)]));
  const pauses = await rows(page, '#pauses');
  assert.deepEqual(pauses.map((r) => [r.attrs.queue, r.buttons.join()]), [['reports', 'resume']]);
  const pending = await rows(page, '#pending');
  const pendingView = (await setup.db.query("SELECT e.id::text FROM throttle.event e WHERE e.state = 'pending' ORDER BY e.run_at, e.id")).rows;
  assert.deepEqual(pending.map((r) => r.attrs.id), pendingView.map((r) => r.id));
  assert.ok(pending.every((r) => r.buttons.join() === 'cancel'));

  if (process.env.DASHBOARD_SCREENSHOT) {
    // A second sample a moment later, with traffic between: rates on the page.
    await setup.db.query("SELECT (throttle.take('api:' || (g % 7), 5, '1 second')).allowed FROM generate_series(1, 400) g");
    await new Promise((r) => setTimeout(r, 1200));
    const n = await renders(page);
    await page.click('#refresh');
    await page.waitForFunction((k) => Number(document.body.getAttribute('data-renders')) > k, {}, n);
    const file = path.resolve(process.env.DASHBOARD_SCREENSHOT);
    fs.mkdirSync(path.dirname(file), { recursive: true });
    await page.screenshot({ path: file, fullPage: true });
  }
  await page.close();
  assert.deepEqual(problems, []);
});

test('Retry makes a dead event pending; Cancel, Pause and Resume act too', async () => {
  const page = await open(op);
  const id = dead['hook:1'];
  let status = await click(page, `#dead tr[data-id="${id}"] button[data-action="retry"]`);
  assert.deepEqual(status, { kind: 'ok', text: `event ${id} is pending again, due now` });
  assert.deepEqual(await one(setup.db, 'SELECT state, attempts FROM throttle.event WHERE id = $1', [id]), { state: 'pending', attempts: 0 });
  assert.equal(await page.$(`#dead tr[data-id="${id}"]`), null, 'the row left the dead events');
  assert.ok(await page.$(`#pending tr[data-id="${id}"]`), 'and is among the pending ones');

  const digest = await one(setup.db, "SELECT id::text FROM throttle.event WHERE queue = 'mail' AND item_key = 'digest:1'");
  status = await click(page, `#pending tr[data-id="${digest.id}"] button[data-action="cancel"]`);
  assert.equal(status.kind, 'ok', status.text);
  assert.equal((await one(setup.db, 'SELECT state FROM throttle.all_events WHERE id = $1', [digest.id])).state, 'cancelled');

  status = await click(page, '#queues tr[data-queue="mail"] button[data-action="pause"]');
  assert.deepEqual(status, { kind: 'ok', text: 'queue "mail" is paused' });
  assert.equal((await one(setup.db, "SELECT count(*)::int AS n FROM throttle.queue_pause WHERE queue = 'mail'")).n, 1);
  status = await click(page, '#queues tr[data-queue="mail"] button[data-action="resume"]');
  assert.equal(status.kind, 'ok', status.text);
  assert.equal((await one(setup.db, "SELECT count(*)::int AS n FROM throttle.queue_pause WHERE queue = 'mail'")).n, 0);
  await page.close();
  assert.deepEqual(problems, []);
});

test('as the read-only role: every section, no button, and a forged request is refused', async () => {
  const page = await open(ro);
  assert.equal(await page.$eval('#role', (e) => e.textContent), `${setup.roles.ro} (read only)`);
  assert.equal(await page.$$eval('button[data-action]', (b) => b.length), 0);
  for (const section of ['queues', 'dead', 'groups', 'pending', 'recurring', 'locks', 'pauses', 'registry-metrics']) {
    assert.ok((await page.$$(`#${section} tbody tr`)).length > 0, section);
  }
  assert.equal(await page.$$eval('main .error', (e) => e.length), 0, 'every section readable');
  const id = dead['hook:2'];
  // The page's own token, from its cookie: the database refuses anyway.
  const forged = await page.evaluate(async (eventId) => {
    // Cookies do not keep ports apart: the operator's dashboard's is here too.
    const name = `pgtd_csrf_${window.location.port}`;
    const token = document.cookie.split(';').map((c) => c.trim().split('=')).find(([k]) => k === name)[1];
    const res = await fetch('/api/actions/retry', {
      method: 'POST', headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': token }, body: JSON.stringify({ id: eventId }),
    });
    return { status: res.status, body: await res.json() };
  }, id);
  assert.equal(forged.status, 403);
  assert.equal(forged.body.code, '42501');
  // The browser notes the refused request on its console: expected here.
  const refused = problems.findIndex((p) => p.startsWith(ro.url) && /status of 403/.test(p));
  if (refused >= 0) problems.splice(refused, 1);
  assert.equal((await one(setup.db, 'SELECT state FROM throttle.event WHERE id = $1', [id])).state, 'dead');
  await page.close();
  assert.deepEqual(problems, []);
});

test('a page of another origin cannot act through the dashboard', async () => {
  const target = `${op.url}api/actions/pause`;
  const pages = {
    // Scripts: with the token (readable: cookies do not keep ports apart),
    // which needs a CORS preflight; and a request without preflight.
    '/fetch': `<script>
window.results = {};
(async () => {
  const m = document.cookie.match(/pgtd_csrf_${op.port}=([^;]+)/);
  window.results.cookie = Boolean(m);
  try {
    const r = await fetch(${JSON.stringify(target)}, { method: 'POST', credentials: 'include',
      headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': m ? m[1] : '' }, body: '{"queue": "mail"}' });
    window.results.preflighted = r.status;
  } catch (e) { window.results.preflighted = 'blocked'; }
  try {
    await fetch(${JSON.stringify(target)}, { method: 'POST', mode: 'no-cors', credentials: 'include',
      headers: { 'Content-Type': 'text/plain' }, body: '{"queue": "mail"}' });
  } catch (e) { /* the answer is not readable here either way */ }
  window.results.done = true;
})();
</script>`,
    // A form posting a body that reads as JSON.
    '/form': `<form id="f" method="POST" action="${target}" enctype="text/plain">
<input name='{"queue": "mail", "pad": "' value='"}'></form>`,
  };
  const evil = http.createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/html' });
    res.end(`<!DOCTYPE html><html><body>${pages[req.url] || ''}</body></html>`);
  });
  await new Promise((resolve) => evil.listen(0, '127.0.0.1', resolve));
  const origin = `http://127.0.0.1:${evil.address().port}`;
  const page = await browser.newPage();
  try {
    opLog.length = 0;
    // The operator's page was opened in this browser: its cookie is there.
    await page.goto(`${origin}/fetch`);
    await page.waitForFunction(() => window.results && window.results.done, { timeout: 10000 });
    const results = await page.evaluate(() => window.results);
    assert.deepEqual(results, { cookie: true, preflighted: 'blocked', done: true });

    await page.goto(`${origin}/form`);
    await Promise.all([page.waitForNavigation(), page.$eval('#f', (f) => f.submit())]);
    assert.match(await page.$eval('body', (b) => b.textContent), /cross-site request refused: Origin/);

    assert.deepEqual(opLog, [
      `403 pause refused: cross-site request refused: Origin "${origin}" is not this dashboard`,
      `403 pause refused: cross-site request refused: Origin "${origin}" is not this dashboard`,
    ]);
    assert.equal((await one(setup.db, "SELECT count(*)::int AS n FROM throttle.queue_pause WHERE queue = 'mail'")).n, 0);
  } finally {
    await page.close();
    await new Promise((resolve) => {
      evil.close(resolve);
      evil.closeAllConnections();
    });
  }
});

// Reads are database transactions: a page of another origin (here another
// port: same-site; a public site is cross-site, refused the same way) firing
// no-cors fetches, an image, and a fetch with the page's read header (which
// needs a CORS preflight) makes the dashboard take no connection at all.
test('a page of another origin cannot make the dashboard query the database', async () => {
  const target = `${op.url}api/overview`;
  let taken = 0;
  const connect = op.pool.connect.bind(op.pool);
  op.pool.connect = (...args) => {
    taken += 1;
    return connect(...args);
  };
  const evil = http.createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/html' });
    res.end(`<!DOCTYPE html><html><body><script>
window.results = {};
(async () => {
  const all = [];
  for (let i = 0; i < 20; i += 1) {
    all.push(fetch(${JSON.stringify(target)} + '?' + i, { mode: 'no-cors', credentials: 'include' }).catch(() => null));
  }
  await new Promise((resolve) => { const img = new Image(); img.onload = img.onerror = resolve; img.src = ${JSON.stringify(target)} + '?img'; });
  try {
    const r = await fetch(${JSON.stringify(target)}, { credentials: 'include', headers: { 'X-PGTD-Read': '1' } });
    window.results.withHeader = r.status;
  } catch (e) { window.results.withHeader = 'blocked'; }
  await Promise.all(all);
  window.results.done = true;
})();
</script></body></html>`);
  });
  await new Promise((resolve) => evil.listen(0, '127.0.0.1', resolve));
  const page = await browser.newPage();
  try {
    await page.goto(`http://127.0.0.1:${evil.address().port}/`);
    await page.waitForFunction(() => window.results && window.results.done === true, { timeout: 20000 });
    assert.equal((await page.evaluate(() => window.results)).withHeader, 'blocked');
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.equal(taken, 0, `another site's page made the dashboard open ${taken} read transactions`);
  } finally {
    op.pool.connect = connect;
    await page.close();
    await new Promise((resolve) => {
      evil.close(resolve);
      evil.closeAllConnections();
    });
  }
});

// What the page says of a section it could not read (by SQLSTATE) and of a
// list the server cut at its limit: the overview is the server's, with a few
// sections replaced.
test('the page says why a section could not be read, and when a list was cut', async () => {
  const real = (await request(op, { path: '/api/overview' })).json;
  const fake = {
    ...real,
    queues: { error: { code: '57014', message: 'canceling statement due to statement timeout' } },
    locks: { error: { code: '42501', message: 'permission denied for view locks' } },
    recurring: { error: { code: 'XX000', message: 'something broke' } },
    pauses: { ...real.pauses, limit: real.pauses.rows.length },
  };
  assert.ok(real.pauses.rows.length > 0);
  const page = await browser.newPage();
  try {
    await page.setRequestInterception(true);
    page.on('request', (r) => {
      if (new URL(r.url()).pathname === '/api/overview') {
        r.respond({ status: 200, contentType: 'application/json', body: JSON.stringify(fake) });
      } else r.continue();
    });
    await page.goto(op.url, { waitUntil: 'load' });
    await page.waitForSelector('body[data-renders]');
    const text = (id) => page.$eval(`#${id} .body`, (e) => e.textContent);
    assert.equal(await text('queues'),
      'Reading this took longer than the statement timeout: canceling statement due to statement timeout (SQLSTATE 57014)');
    assert.equal(await text('locks'), `Role ${setup.roles.op} may not read this: permission denied for view locks (SQLSTATE 42501)`);
    assert.equal(await text('recurring'), 'Could not read this: something broke (SQLSTATE XX000)');
    assert.match(await text('pauses'), new RegExp(`The first ${real.pauses.rows.length} shown; there may be more\\.$`));
    assert.doesNotMatch(await text('pending'), /shown; there may be more/);
  } finally {
    await page.close();
  }
});
