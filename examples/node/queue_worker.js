#!/usr/bin/env node
// A pg_throttle queue worker with node-postgres (npm `pg`).
//
//   node queue_worker.js --queue mail [--groups] [--worker NAME] [--lease 30] [--max 10]
//                        [--poll 60] [--retry-in SECONDS] [--log FILE] [--work-ms 100]
//
// Connects with the libpq environment (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE).
// It LISTENs on the channel named after the queue, where pg_throttle NOTIFYs every event
// that becomes claimable (also when a run_at ahead, a backoff or a lease falls due), and
// also polls every --poll seconds: a NOTIFY is only a hint (one freed by another worker's
// transaction may become claimable without one; docs/queue.md). Each claim's lease is extended every lease/3 while the work
// runs; a claim that could not be extended is lost (another worker may have taken it
// over), so its events are neither completed nor failed; so is one whose complete or fail
// ends fewer events than it was given. After a failure in a group claim (--groups), the
// claim's later events are extended before they are handled: in a group in strict order
// the failure handed them back (they run after the failed event's retry), and extend
// renewing fewer says so. An ungrouped claim's events are never handed back by a fail, so
// it skips that extend (a durable commit per failure).
//
// SIGTERM (or SIGINT) stops claiming and finishes the events held; a second one aborts the
// work and hands the events back at once with fail(..., retry_in => '0') (an event whose
// work had already succeeded is completed first). Exits 0 either way.
'use strict';

const fs = require('node:fs');
const os = require('node:os');
const { parseArgs } = require('node:util');
const { Client } = require('pg');

const { values: opts } = parseArgs({
  options: {
    queue: { type: 'string' },
    groups: { type: 'boolean', default: false },        // claim_group instead of claim
    worker: { type: 'string', default: `${os.hostname()}-${process.pid}` },
    lease: { type: 'string', default: '30' },           // seconds
    max: { type: 'string' },                            // events per claim
    poll: { type: 'string', default: '60' },            // seconds between polls
    'retry-in': { type: 'string' },                     // seconds; default: the queue's backoff
    log: { type: 'string' },                            // JSON lines, one per handled event
    'work-ms': { type: 'string', default: '100' },
  },
});
if (!opts.queue) {
  console.error('usage: queue_worker.js --queue NAME [--groups] [--worker NAME] [--lease S] ...');
  process.exit(2);
}
const QUEUE = opts.queue;
const WORKER = opts.worker;
const LEASE_S = Number(opts.lease);
// claim takes one event by default; claim_group takes all of the group's due events (NULL).
const MAX = opts.max !== undefined ? Number(opts.max) : (opts.groups ? null : 10);
const POLL_MS = Number(opts.poll) * 1000;
const RETRY_IN_S = opts['retry-in'] !== undefined ? Number(opts['retry-in']) : null;
const WORK_MS = Number(opts['work-ms']);

function log(message) {
  console.error(`${WORKER}: ${message}`);
}

// The work. Replace this with yours: throw to fail the event (it is retried after a
// backoff, until max_attempts); honour `signal`, which aborts when the claim is lost or a
// second SIGTERM hands the event back.
async function handle(event, signal) {
  const start = Date.now();
  await sleep(WORK_MS, signal);
  const end = Date.now();
  // This demo fails an event whose payload says so, on its first attempt only.
  const failing = event.payload && event.payload.fail === true && event.attempts === 1;
  if (opts.log) {
    fs.appendFileSync(opts.log, JSON.stringify({
      worker: WORKER, pid: process.pid, id: event.id, item_key: event.item_key,
      group_key: event.group_key, attempt: event.attempts, failed: failing, start, end,
    }) + '\n');
  }
  if (failing) throw new Error(`demo failure of ${event.item_key} on attempt ${event.attempts}`);
}

// ---------------------------------------------------------------------------------------

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal && signal.aborted) return reject(signal.reason);
    const timer = setTimeout(done, ms);
    function done() {
      if (signal) signal.removeEventListener('abort', aborted);
      resolve();
    }
    function aborted() {
      clearTimeout(timer);
      reject(signal.reason);
    }
    if (signal) signal.addEventListener('abort', aborted, { once: true });
  });
}

let stopping = false;      // first SIGTERM: claim nothing more
let handingBack = false;   // second SIGTERM: give the held events back now
let current = null;        // the claim being worked on: { abort: AbortController }

// A wake-up for the idle loop: a NOTIFY, a signal, or the poll timer.
let wakeUp = null;
let woken = false;         // a wake-up that came while the loop was not sleeping
function wake() {
  woken = true;
  if (wakeUp) wakeUp();
}
function idle(ms) {
  if (woken) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    wakeUp = () => { clearTimeout(timer); resolve(); };
  }).finally(() => { wakeUp = null; });
}

function onSignal(signal) {
  if (!stopping) {
    log(`${signal}: finishing the events held, then exiting`);
    stopping = true;
    wake();
  } else if (!handingBack) {
    log(`second ${signal}: handing the events held back`);
    handingBack = true;
    if (current) current.abort.abort(new Error('worker shutting down'));
  }
}
process.on('SIGTERM', onSignal);
process.on('SIGINT', onSignal);

// One connection for the queue's functions, one that only LISTENs. Each statement runs in a
// transaction of its own (node-postgres autocommits), so a complete frees its group at once.
const db = new Client({ application_name: `queue_worker ${WORKER}` });
const listener = new Client({ application_name: `queue_worker ${WORKER} (listen)` });
for (const client of [db, listener]) {
  client.on('error', (err) => {
    // The claims held end with their lease; a supervisor restarts the worker.
    log(`connection lost: ${err.message}`);
    process.exit(1);
  });
}

async function claim() {
  // claim_token and id are bigints: node-postgres returns int8 as a string, since Number()
  // is exact only to 2^53. Keep them strings and pass them back as they are.
  const sql = opts.groups
    ? 'SELECT id, item_key, group_key, payload, attempts, claim_token ' +
      'FROM throttle.claim_group($1, $2, make_interval(secs => $3), $4)'
    : 'SELECT id, item_key, group_key, payload, attempts, claim_token ' +
      'FROM throttle.claim($1, $2, make_interval(secs => $3), $4)';
  const { rows } = await db.query(sql, [QUEUE, WORKER, LEASE_S, MAX]);
  return rows;
}

async function extend(ids, token) {
  const { rows } = await db.query(
    'SELECT throttle.extend($1::bigint[], $2::bigint, make_interval(secs => $3)) AS n',
    [ids, token, LEASE_S]);
  return rows[0].n;
}

async function complete(ids, token) {
  const { rows } = await db.query(
    'SELECT throttle.complete($1::bigint[], $2::bigint) AS n', [ids, token]);
  return rows[0].n;
}

async function fail(ids, token, error, retryInS) {
  const { rows } = await db.query(
    'SELECT throttle.fail($1::bigint[], $2::bigint, $3, make_interval(secs => $4)) AS n',
    [ids, token, error, retryInS]);
  return rows[0].n;
}

// Works through one claim's events in the order claim returned them (a group's in run_at
// order), one at a time, ending each as soon as its work ends.
async function work(events) {
  const token = events[0].claim_token;
  const held = new Set(events.map((e) => e.id));
  const abort = new AbortController();
  let lost = false;
  current = { abort };

  // The heartbeat. An id leaves `held` before its complete/fail is sent, and queries run in
  // the order they are sent, so an extend never counts an event this worker has ended.
  const heartbeat = setInterval(async () => {
    const ids = [...held];
    if (ids.length === 0 || lost) return;
    try {
      const n = await extend(ids, token);
      if (n < ids.length) giveUp(`extended ${n} of ${ids.length}`);
    } catch (err) {
      giveUp(`extend failed: ${err.message}`);
    }
  }, (LEASE_S * 1000) / 3);

  // The claim is lost: another worker may hold its events by now, so stop its work and
  // neither complete nor fail any more of them.
  function giveUp(why) {
    if (!lost) log(`claim ${token} lost (${why}); stopping its work`);
    lost = true;
    abort.abort(new Error('claim lost'));
  }

  try {
    for (const event of events) {
      if (lost || handingBack) break;
      let error = null;
      try {
        await handle(event, abort.signal);
      } catch (err) {
        error = err;
      }
      if (lost) break;                       // neither complete nor fail: it may run elsewhere
      if (handingBack && error !== null) break;   // aborted by the second SIGTERM: handed back below
      // A success stands even when a second SIGTERM came meanwhile: complete it rather than
      // hand it back to run again.
      held.delete(event.id);
      if (error === null) {
        const n = await complete([event.id], token);
        if (n < 1) giveUp(`complete of ${event.id} changed nothing`);
      } else {
        log(`event ${event.id} (${event.item_key}) failed: ${error.message}`);
        const n = await fail([event.id], token, String(error.message || error), RETRY_IN_S);
        if (n < 1) {
          giveUp(`fail of ${event.id} changed nothing`);
        } else if (event.group_key !== null && held.size > 0 && !lost) {
          // In a group in strict order, the failure handed the claim's later events back:
          // they run after this one's retry, and handling them now would break the order
          // (complete would refuse them anyway). extend renews only what the claim holds.
          const rest = [...held];
          let renewed;
          try {
            renewed = await extend(rest, token);
          } catch (err) {
            giveUp(`extend failed: ${err.message}`);   // as in the heartbeat
          }
          if (renewed !== undefined && renewed < rest.length) {
            log(`claim ${token}: after the failure of ${event.id}, extend renewed ${renewed} of its ` +
                `${rest.length} later events: they are no longer held (strict order hands them ` +
                'back after a failure, or the lease ended); leaving them');
            lost = true;    // nothing of this claim is handled, completed or failed any more
          }
        }
      }
    }
    if (handingBack && !lost && held.size > 0) {
      // Pending again at once, for another worker (the attempt stays counted).
      const ids = [...held];
      held.clear();
      const n = await fail(ids, token, 'worker shutting down', 0);
      log(`handed back ${n} event(s)`);
    }
  } finally {
    clearInterval(heartbeat);
    current = null;
  }
}

async function main() {
  await db.connect();
  await listener.connect();
  listener.on('notification', wake);
  await listener.query(`LISTEN ${listener.escapeIdentifier(QUEUE)}`);
  log(`listening on ${JSON.stringify(QUEUE)}, ${opts.groups ? 'claim_group' : 'claim'}, ` +
      `lease ${LEASE_S} s, poll ${POLL_MS / 1000} s`);

  let announced = false;
  while (!stopping) {
    woken = false;     // a NOTIFY from now on wakes the idle() after this claim
    const events = await claim();
    if (events.length > 0) {
      await work(events);
      continue;
    }
    if (!announced) {
      announced = true;
      console.log('ready');   // the first empty claim: the test knows the worker is idle
    }
    await idle(POLL_MS);
  }
  await listener.end();
  await db.end();
  log('stopped');
}

main().catch((err) => {
  log(`fatal: ${err.stack || err}`);
  process.exit(1);
});
