'use strict';
// The queue worker runtime: claims events of one queue (throttle.claim, or claim_group),
// runs a handler on them with up to `concurrency` claims at once, keeps each claim's lease
// alive with a heartbeat while its handler runs, and ends each event with complete, or fail
// with the error and a retry delay.
//
// It LISTENs on the channel named after the queue, where pg_throttle NOTIFYs every event that
// becomes claimable (also when a run_at ahead, a backoff or a lease falls due), and polls every
// pollSeconds as well: a NOTIFY is only a hint (docs/queue.md).
//
// A claim whose extend renews fewer events than it was given, or whose complete or fail ends
// fewer, is lost (its lease ended and another worker may hold the events, or release_group
// fenced it): its handler's signal aborts and none of its events is completed or failed any
// more. After a failure in a group claim, the claim's later events are extended before they
// are handled: in a group kept in strict order the fail handed them back (they run after the
// failed event's retry), and an extend that renews fewer says so; the worker leaves them.
//
// stop() claims nothing more and finishes the events held; stop({ abort: true }) aborts the
// handlers and hands the events held back at once with fail(..., retry_in => '0') (an event
// whose handler had already succeeded is completed first). With handleSignals, SIGTERM or SIGINT
// does the first, a second one the second.
//
// claim_token and id are bigint: they stay strings, passed back as they are.

const EventEmitter = require('node:events');
const os = require('node:os');
const { Client } = require('pg');
const { ensureVersion } = require('./version');
const { seconds } = require('./util');

const SHUTDOWN = 'worker shutting down';

class Worker extends EventEmitter {
  constructor(options = {}) {
    super();
    const {
      queue, handler, groups = false, concurrency = 1, max, lease = 30, pollSeconds = 60,
      retryIn = null, workerName = `${os.hostname()}-${process.pid}`, batch = false,
      connection = {}, handleSignals = false, applicationName,
    } = options;
    if (typeof queue !== 'string' || queue === '') throw new TypeError('queue is required');
    if (typeof handler !== 'function') throw new TypeError('handler must be a function');
    if (!Number.isInteger(concurrency) || concurrency < 1) {
      throw new RangeError(`concurrency must be an integer >= 1, not ${concurrency}`);
    }
    const maxDefault = groups ? null : 1;   // claim takes one; claim_group the group's due events
    const maxValue = max === undefined ? maxDefault : max;
    if ((maxValue === null && !groups) || (maxValue !== null && (!Number.isInteger(maxValue) || maxValue < 1))) {
      throw new RangeError(`max must be an integer >= 1 (or null with groups), not ${max}`);
    }
    this.queue = queue;
    this.workerName = String(workerName);
    this.groups = Boolean(groups);
    this.concurrency = concurrency;
    this.max = maxValue;
    this.lease = seconds(lease, 'lease', { positive: true });
    this.pollSeconds = seconds(pollSeconds, 'pollSeconds', { positive: true });
    this.retryIn = seconds(retryIn, 'retryIn', { allowNull: true });
    this.batch = Boolean(batch);
    this._handler = handler;
    this._connection = typeof connection === 'string' ? { connectionString: connection } : connection;
    this._appName = applicationName || `pg-throttle worker ${this.workerName}`;
    this._handleSignals = Boolean(handleSignals);

    this._started = false;
    this._stopping = false;      // claim nothing more
    this._handingBack = false;   // give the held events back now
    this._fatal = null;
    this._claims = new Set();    // the claims being worked on: their AbortControllers
    this._inflight = new Set();  // their promises
    this._wakeUp = null;
    this._woken = false;         // a wake-up that came while the loop was not idle
    this._signalHandler = null;
    this._done = null;
    this._tail = Promise.resolve();   // the last query sent on the queue's session
  }

  // One session's queries, sent one after the other in the order they are asked for (the
  // heartbeat relies on that order; node-postgres deprecates queueing them itself).
  _query(sql, params) {
    const p = this._tail.then(() => this._db.query(sql, params));
    this._tail = p.catch(() => {});
    return p;
  }

  _log(message) {
    this.emit('log', message);
  }

  // Connects (two sessions: one for the queue's functions, one that only LISTENs), checks the
  // extension's version, LISTENs, then runs until stop(). Resolves once it listens.
  async start() {
    if (this._started) throw new Error('the worker was started already');
    this._started = true;
    const db = new Client({ application_name: this._appName, ...this._connection });
    const listener = new Client({ application_name: `${this._appName} (listen)`, ...this._connection });
    this._db = db;
    this._listener = listener;
    for (const client of [db, listener]) {
      // The claims held end with their lease; the caller restarts the worker.
      client.on('error', (err) => this._die(err, `connection lost: ${err.message}`));
    }
    try {
      await db.connect();
      await listener.connect();
      await ensureVersion(db);
      listener.on('notification', () => this._wake());
      await listener.query(`LISTEN ${listener.escapeIdentifier(this.queue)}`);
    } catch (err) {
      await this._close();
      throw err;
    }
    if (this._handleSignals) this._installSignals();
    this._log(`listening on ${JSON.stringify(this.queue)}, ${this.groups ? 'claim_group' : 'claim'}, ` +
              `lease ${this.lease} s, poll ${this.pollSeconds} s`);
    this._done = this._run().then(
      async () => { await this._finish(); if (this._fatal) throw this._fatal; },
      async (err) => { this._die(err, `fatal: ${err.stack || err}`); await this._finish(); throw this._fatal; });
    this._done.catch(() => {});   // reported through wait() and the 'error' event
    return this;
  }

  // Resolves when the worker has stopped; rejects with the error that stopped it.
  wait() {
    if (!this._done) return Promise.reject(new Error('the worker was not started'));
    return this._done;
  }

  // Stops claiming. { abort: false }: finishes the events held. { abort: true }: aborts the
  // handlers' signals and hands the events held back (due at once). Resolves when stopped.
  stop({ abort = false } = {}) {
    if (!this._stopping) this.emit('stopping', { abort });
    this._stopping = true;
    if (abort && !this._handingBack) {
      this._handingBack = true;
      for (const c of this._claims) c.abort(new Error(SHUTDOWN));
    }
    this._wake();
    return this._done ? this._done : Promise.resolve();
  }

  _installSignals() {
    this._signalHandler = (signal) => {
      if (!this._stopping) {
        this._log(`${signal}: finishing the events held, then exiting`);
        this.stop();
      } else if (!this._handingBack) {
        this._log(`second ${signal}: handing the events held back`);
        this.stop({ abort: true });
      }
    };
    process.on('SIGTERM', this._signalHandler);
    process.on('SIGINT', this._signalHandler);
  }

  _die(err, message) {
    if (this._fatal) return;
    this._fatal = err;
    this._log(message);
    this._stopping = true;
    for (const c of this._claims) c.abort(err);
    this._wake();
    if (this.listenerCount('error') > 0) this.emit('error', err);
  }

  async _close() {
    if (this._signalHandler) {
      process.removeListener('SIGTERM', this._signalHandler);
      process.removeListener('SIGINT', this._signalHandler);
      this._signalHandler = null;
    }
    await Promise.allSettled([this._listener.end(), this._db.end()]);
  }

  async _finish() {
    await this._close();
    if (!this._fatal) this._log('stopped');
    this.emit('stopped');
  }

  _wake() {
    this._woken = true;
    if (this._wakeUp) this._wakeUp();
  }

  _idle(ms) {
    if (this._woken) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this._wakeUp = () => { clearTimeout(timer); resolve(); };
    }).finally(() => { this._wakeUp = null; });
  }

  async _run() {
    let announced = false;
    const pollMs = this.pollSeconds * 1000;
    while (!this._stopping) {
      if (this._inflight.size >= this.concurrency) {
        this._woken = false;   // a finished claim, or stop(), wakes this
        await this._idle(pollMs);
        continue;
      }
      this._woken = false;     // a NOTIFY from now on wakes the idle() after this claim
      const events = await this._claim();
      if (events.length > 0) {
        const p = this._work(events)
          .catch((err) => this._die(err, `fatal: ${err.stack || err}`))
          .finally(() => { this._inflight.delete(p); this._wake(); });
        this._inflight.add(p);
        continue;
      }
      if (!announced) {
        announced = true;
        this.emit('ready');   // the first empty claim: the worker is idle
      }
      await this._idle(pollMs);
    }
    await Promise.all(this._inflight);
  }

  async _claim() {
    const fn = this.groups ? 'claim_group' : 'claim';
    const { rows } = await this._query(
      `SELECT * FROM throttle.${fn}($1, $2, make_interval(secs => $3), $4)`,
      [this.queue, this.workerName, this.lease, this.max]);
    if (rows.length > 0) this.emit('claimed', rows);
    return rows;
  }

  async _extend(ids, token) {
    const { rows } = await this._query(
      'SELECT throttle.extend($1::bigint[], $2::bigint, make_interval(secs => $3)) AS n',
      [ids, token, this.lease]);
    return rows[0].n;
  }

  async _complete(ids, token) {
    const { rows } = await this._query(
      'SELECT throttle.complete($1::bigint[], $2::bigint) AS n', [ids, token]);
    return rows[0].n;
  }

  async _fail(ids, token, error, retryIn) {
    const { rows } = await this._query(
      'SELECT throttle.fail($1::bigint[], $2::bigint, $3, make_interval(secs => $4)) AS n',
      [ids, token, error, retryIn]);
    return rows[0].n;
  }

  // Works through one claim's events in the order claim returned them (a group's in run_at
  // order), one at a time (or all at once with batch), ending each as soon as its work ends.
  async _work(events) {
    const token = events[0].claim_token;
    const held = new Set(events.map((e) => e.id));
    const abort = new AbortController();
    let lost = false;
    this._claims.add(abort);
    if (this._handingBack) abort.abort(new Error(SHUTDOWN));

    // The heartbeat. An id leaves `held` before its complete/fail is sent, and one session's
    // queries run in the order they are sent, so an extend never counts an event this worker
    // has ended.
    const heartbeat = setInterval(async () => {
      const ids = [...held];
      if (ids.length === 0 || lost) return;
      try {
        const n = await this._extend(ids, token);
        if (n < ids.length) giveUp(`extended ${n} of ${ids.length}`);
      } catch (err) {
        giveUp(`extend failed: ${err.message}`);
      }
    }, (this.lease * 1000) / 3);

    // Another worker may hold the events by now: stop their work, end none of them.
    const giveUp = (why) => {
      if (!lost) {
        this._log(`claim ${token} lost (${why}); stopping its work`);
        this.emit('lost', { token, reason: why, ids: [...held] });
      }
      lost = true;
      abort.abort(new Error('claim lost'));
    };

    const units = this.batch ? [events] : events.map((e) => [e]);
    const ctx = { signal: abort.signal, token, fence: token, queue: this.queue,
                  worker: this.workerName, claim: events };
    try {
      for (const unit of units) {
        if (lost || this._handingBack) break;
        let error = null;
        try {
          await this._handler(this.batch ? unit : unit[0], ctx);
        } catch (err) {
          error = err === null || err === undefined ? new Error(String(err)) : err;
        }
        if (lost) break;                                 // it may run elsewhere: end nothing
        if (this._handingBack && error !== null) break;  // aborted: handed back below
        // A success stands even when an abort came meanwhile: complete it rather than hand
        // it back to run again.
        const ids = unit.map((e) => e.id);
        for (const id of ids) held.delete(id);
        if (error === null) {
          const n = await this._complete(ids, token);
          if (n < ids.length) giveUp(`complete of ${ids.join(',')} changed ${n}`);
          else for (const e of unit) this.emit('completed', e);
          continue;
        }
        const message = String((error && error.message) || error);
        for (const e of unit) this._log(`event ${e.id} (${e.item_key}) failed: ${message}`);
        const retryIn = error.retryIn !== undefined
          ? seconds(error.retryIn, 'error.retryIn', { allowNull: true }) : this.retryIn;
        const n = await this._fail(ids, token, message, retryIn);
        if (n < ids.length) {
          giveUp(`fail of ${ids.join(',')} changed ${n}`);
          continue;
        }
        for (const e of unit) this.emit('failed', e, error);
        if (unit.some((e) => e.group_key !== null) && held.size > 0 && !lost) {
          // In a group in strict order the failure handed the claim's later events back:
          // they run after this one's retry, and handling them now would break the order
          // (complete would refuse them anyway). extend renews only what the claim holds.
          const rest = [...held];
          let renewed;
          try {
            renewed = await this._extend(rest, token);
          } catch (err) {
            giveUp(`extend failed: ${err.message}`);
          }
          if (renewed !== undefined && renewed < rest.length) {
            this._log(`claim ${token}: after the failure of ${ids.join(',')}, extend renewed ${renewed} ` +
                      `of its ${rest.length} later events: they are no longer held (strict order hands ` +
                      'them back after a failure, or the lease ended); leaving them');
            this.emit('left', { token, ids: rest });
            lost = true;   // nothing of this claim is handled, completed or failed any more
          }
        }
      }
      if (this._handingBack && !lost && held.size > 0 && !this._fatal) {
        // Pending again at once, for another worker (the attempt stays counted).
        const ids = [...held];
        held.clear();
        const n = await this._fail(ids, token, SHUTDOWN, 0);
        this._log(`handed back ${n} event(s)`);
        this.emit('handedBack', { token, ids, count: n });
      }
    } finally {
      clearInterval(heartbeat);
      this._claims.delete(abort);
    }
  }
}

module.exports = { Worker };
