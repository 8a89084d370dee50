'use strict';
// A worker process for test/processes.test.js: forked with its name, queue, lease and log
// file. It logs each handler run's start and end, and each event it completed (after
// complete returned), as JSON lines; an event whose payload says {"slow": true} takes 60 s
// on its first attempt (the test SIGKILLs the process that runs it).
const fs = require('node:fs');
const { Worker } = require('..');

// An optional fifth argument, JSON: { "ignoreSignal": true } makes the slow handler ignore its
// signal; the other keys are Worker options (abortGrace).
const [name, queue, lease, logPath, extra] = process.argv.slice(2);
const { ignoreSignal = false, ...more } = extra ? JSON.parse(extra) : {};
const log = (rec) => fs.appendFileSync(logPath, JSON.stringify({ worker: name, pid: process.pid, ...rec }) + '\n');

const worker = new Worker({
  queue,
  workerName: name,
  lease: Number(lease),
  pollSeconds: 0.3,
  concurrency: 2,
  max: 1,
  handleSignals: true,
  ...more,
  handler: async (event, { signal }) => {
    log({ kind: 'start', id: event.id, attempt: event.attempts, at: Date.now() });
    const ms = event.payload.slow && event.attempts === 1 ? 60000 : 20;
    await new Promise((resolve, reject) => {
      const t = setTimeout(resolve, ms);
      if (ignoreSignal) return;
      signal.addEventListener('abort', () => { clearTimeout(t); reject(signal.reason); }, { once: true });
    });
    log({ kind: 'end', id: event.id, attempt: event.attempts, at: Date.now() });
  },
});
worker.on('completed', (event) => log({ kind: 'completed', id: event.id, attempt: event.attempts }));
worker.on('claimed', (events) => { if (events.some((e) => e.payload.slow)) process.send({ slow: events[0].id }); });
worker.on('log', (message) => process.send({ log: message }));
worker.once('ready', () => process.send({ ready: true }));
worker.start().then(() => worker.wait()).then(() => process.exit(0), (err) => {
  console.error(`${name}: ${err.stack || err}`);
  process.exit(1);
});
