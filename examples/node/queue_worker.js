#!/usr/bin/env node
// A pg_throttle queue worker on the pg-throttle client (clients/node).
//
//   node queue_worker.js --queue mail [--groups] [--worker NAME] [--lease 30] [--max 10]
//                        [--poll 60] [--retry-in SECONDS] [--log FILE] [--work-ms 100]
//                        [--concurrency 1]
//
// Connects with the libpq environment (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE). The
// client's Worker LISTENs on the channel named after the queue and polls every --poll
// seconds, claims with throttle.claim (or claim_group with --groups), extends each claim's
// lease every lease/3 while the work runs, and ends each event with complete, or fail with
// the error (retried after --retry-in seconds, or the queue's backoff). A claim it cannot
// extend is lost: its work is stopped, and its events are neither completed nor failed.
//
// SIGTERM (or SIGINT) stops claiming and finishes the events held; a second one aborts the
// work and hands the events back at once with fail(..., retry_in => '0') (work that ignores
// the abort is not waited for beyond a second). Exits 0 either way; a third signal exits at
// once (143 for SIGTERM), and a stalled connection stops the worker (exit 1).
'use strict';

const fs = require('node:fs');
const os = require('node:os');
const { parseArgs } = require('node:util');
const { Worker } = require('pg-throttle');

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
    concurrency: { type: 'string', default: '1' },      // claims worked on at once
  },
});
if (!opts.queue) {
  console.error('usage: queue_worker.js --queue NAME [--groups] [--worker NAME] [--lease S] ...');
  process.exit(2);
}
const WORKER = opts.worker;
const WORK_MS = Number(opts['work-ms']);

// The work. Replace this with yours: throw to fail the event (it is retried after a
// backoff, until max_attempts); honour `signal`, which aborts when the claim is lost or a
// second SIGTERM hands the event back.
async function handle(event, { signal }) {
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

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const timer = setTimeout(() => { signal.removeEventListener('abort', aborted); resolve(); }, ms);
    function aborted() { clearTimeout(timer); reject(signal.reason); }
    signal.addEventListener('abort', aborted, { once: true });
  });
}

const worker = new Worker({
  queue: opts.queue,
  workerName: WORKER,
  groups: opts.groups,
  // claim takes 10 events at a time here; claim_group all of the group's due events (null).
  max: opts.max !== undefined ? Number(opts.max) : (opts.groups ? null : 10),
  lease: Number(opts.lease),
  pollSeconds: Number(opts.poll),
  retryIn: opts['retry-in'] !== undefined ? Number(opts['retry-in']) : null,
  concurrency: Number(opts.concurrency),
  applicationName: `queue_worker ${WORKER}`,
  handleSignals: true,          // SIGTERM/SIGINT: finish; a second one: hand back
  handler: handle,
});
worker.on('log', (message) => console.error(`${WORKER}: ${message}`));
worker.once('ready', () => console.log('ready'));   // the first empty claim: idle

worker.start()
  .then(() => worker.wait())
  .then(() => process.exit(0), () => process.exit(1));   // the error was logged
