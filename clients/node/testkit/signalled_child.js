'use strict';
// A forked testkit/child_worker.js with handleSignals, holding one slow event, after a first
// SIGTERM: the shared start of the signal tests. Returns { child, logs, exit, slow }.
const assert = require('node:assert');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { fork } = require('node:child_process');
const { scheduleMany } = require('..');
const { waitFor } = require('./db');

const CHILD = path.join(__dirname, 'child_worker.js');

async function childAfterFirstSigterm(t, db, name, queue, options = null) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `pg-throttle-${name}.`));
  const args = [`${name}-0`, queue, '30', path.join(tmp, `${name}-0.jsonl`)];
  if (options) args.push(JSON.stringify(options));
  const child = fork(CHILD, args, { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  t.after(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    fs.rmSync(tmp, { recursive: true, force: true });
  });
  const logs = [];
  let claimed = null;
  child.on('message', (m) => { if (m.log) logs.push(m.log); if (m.slow) claimed = m.slow; });
  const exit = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  const [slow] = await scheduleMany(db, queue, [{ itemKey: 'slow', payload: { slow: true } }]);
  assert.ok(await waitFor(() => claimed === slow, 15000));
  child.kill('SIGTERM');
  assert.ok(await waitFor(() => logs.includes('SIGTERM: finishing the events held, then exiting')), logs.join('\n'));
  return { child, logs, exit, slow };
}

module.exports = { childAfterFirstSigterm };
