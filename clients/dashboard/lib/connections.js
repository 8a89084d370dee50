'use strict';
// The pool's clients as the requests take them, so that closing the dashboard
// is prompt: close() rejects the requests still waiting for a connection
// (node-postgres's pool.end() leaves them waiting until its connection
// timeout) and ends the connections in use (their queries fail at once), then
// ends the pool.
class ShuttingDown extends Error {
  constructor() {
    super('the dashboard is shutting down');
    this.code = 'PGTD_SHUTDOWN';
  }
}

class Connections {
  constructor(pool) {
    this.pool = pool;
    this.waiting = new Set(); // reject functions of connect() calls not answered yet
    this.busy = new Set(); // clients handed out
    this.closed = false;
  }

  // A client of the pool, like pool.connect(); release it with client.release(err?).
  connect() {
    if (this.closed) return Promise.reject(new ShuttingDown());
    return new Promise((resolve, reject) => {
      const waiter = { reject, done: false };
      this.waiting.add(waiter);
      this.pool.connect().then((client) => {
        this.waiting.delete(waiter);
        if (waiter.done) {
          // Closed meanwhile: the request was answered already.
          client.release(new ShuttingDown());
          return;
        }
        waiter.done = true;
        const release = client.release;
        this.busy.add(client);
        client.release = (err) => {
          this.busy.delete(client);
          client.release = release;
          return release.call(client, err);
        };
        resolve(client);
      }, (e) => {
        this.waiting.delete(waiter);
        if (!waiter.done) {
          waiter.done = true;
          reject(e);
        }
      });
    });
  }

  async close() {
    this.closed = true;
    for (const waiter of this.waiting) {
      if (!waiter.done) {
        waiter.done = true;
        waiter.reject(new ShuttingDown());
      }
    }
    // A query in flight fails ("Connection terminated"); its request releases the client.
    for (const client of this.busy) client.end().catch(() => {});
    await this.pool.end().catch(() => {});
  }
}

module.exports = { Connections, ShuttingDown };
