'use strict';
// Workers made by a test file, each logging into w.messages, all stopped (aborting, at most
// 3 s each) after every test.
const { Worker } = require('..');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// 'resolved', 'rejected', or 'pending' when `p` has not settled within `ms`.
const settledWithin = (p, ms) => Promise.race([p.then(() => 'resolved', () => 'rejected'),
  sleep(ms).then(() => 'pending')]);

function useWorkers(test) {
  const workers = [];
  test.afterEach(async () => {
    await Promise.allSettled(workers.splice(0).map((w) => Promise.race([
      w.stop({ abort: true }), new Promise((r) => setTimeout(r, 3000).unref())])));
  });
  return function makeWorker(options) {
    const w = new Worker({ pollSeconds: 0.2, lease: 10, ...options });
    w.messages = [];
    w.on('log', (m) => w.messages.push(m));
    w.on('error', () => {});
    workers.push(w);
    return w;
  };
}

module.exports = { useWorkers, sleep, settledWithin };
