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
// more. So is a claim none of whose extends answered within the lease (less a margin) of the
// last one that did, reckoned from when that one was sent: on a stalled connection the lease
// may have ended, and another worker may run the events. A query of the worker's session
// that gets no answer within queryTimeout stops the worker (wait() rejects, so that a
// supervisor restarts it), and so does a connection error; an SQL error of complete or fail
// only gives the claim up. After a failure in a group claim, the claim's later events are extended before they
// are handled: in a group kept in strict order the fail handed them back (they run after the
// failed event's retry), and an extend that renews fewer says so; the worker leaves them.
//
// stop() claims nothing more and finishes the events held; stop({ abort: true }) aborts the
// handlers and hands the events held back with fail(..., retry_in => '0') (an event whose
// handler succeeds within abortGrace seconds is completed instead); a handler still running
// after abortGrace is not waited for: its events are handed back and its late outcome is
// ignored. With handleSignals, SIGTERM or SIGINT does the first, a second one the second, and a
// third exits the process at once.
//
// claim_token and id are bigint: they stay strings, passed back as they are.

const EventEmitter = require('node:events');
const os = require('node:os');
const { Client } = require('pg');
const { ensureVersion } = require('./version');
const { seconds, timerMs, Deadline, leaseMarginMs, errorMessage } = require('./util');

const SHUTDOWN = 'worker shutting down';
const ABANDONED = Symbol('abandoned');   // a handler not waited for any more
const MAX_QUEUE_BYTES = 63;              // pg_throttle's longest queue name (also a channel)

// An error of the session itself (lost, cut, timed out), as opposed to one the server raised
// for a statement (a DatabaseError with its SQLSTATE) on a session that still works.
function isConnectionError(err) {
  const code = err && typeof err === 'object' ? err.code : undefined;
  const fromServer = typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) && 'severity' in err;
  return !fromServer || code.startsWith('08') || code.startsWith('57P');
}

class Worker extends EventEmitter {
  constructor(options = {}) {
    super();
    const {
      queue, handler, groups = false, concurrency = 1, max, lease = 30, pollSeconds = 60,
      retryIn = null, workerName = `${os.hostname()}-${process.pid}`, batch = false,
      connection = {}, handleSignals = false, applicationName, queryTimeout, abortGrace = 1,
    } = options;
    if (typeof queue !== 'string' || queue === '') throw new TypeError('queue is required');
    if (Buffer.byteLength(queue) > MAX_QUEUE_BYTES) {
      throw new RangeError(`queue must be 1 to ${MAX_QUEUE_BYTES} bytes (pg_throttle's limit; it is also ` +
                           `the LISTEN channel), not ${Buffer.byteLength(queue)}`);
    }
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
    this.queryTimeout = queryTimeout === undefined || queryTimeout === null
      ? Math.max(this.lease / 3, 5) : seconds(queryTimeout, 'queryTimeout', { positive: true });
    this.abortGrace = seconds(abortGrace, 'abortGrace');
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
    // abortGrace seconds after stop({ abort: true }) or a fatal error, the handlers still
    // running are not waited for any more: their waiters are called.
    this._abandoned = false;
    this._abandonWaiters = new Set();
    this._abandonTimer = null;
  }

  // One session's queries, sent one after the other in the order they are asked for (the
  // heartbeat relies on that order; node-postgres deprecates queueing them itself). The result
  // has `sentAt`: when the query went out (performance.now()). A query with no answer within
  // queryTimeout stops the worker: its session is stalled.
  _query(sql, params) {
    const p = this._tail.then(() => {
      const sentAt = performance.now();
      const watchdog = setTimeout(() => this._stalled(), timerMs(this.queryTimeout * 1000));
      return this._db.query(sql, params).then(
        (result) => { clearTimeout(watchdog); result.sentAt = sentAt; return result; },
        (err) => { clearTimeout(watchdog); throw err; });
    });
    this._tail = p.catch(() => {});
    return p;
  }

  _stalled() {
    const err = new Error(`the worker's session answered no query within ${this.queryTimeout} s ` +
                          '(queryTimeout): the connection is stalled');
    err.code = 'PG_THROTTLE_STALLED';
    this._die(err, `${err.message}; stopping`);
    // With a query in progress, end() destroys the socket: every query waiting rejects.
    this._db.end().catch(() => {});
  }

  _log(message) {
    this.emit('log', message);
  }

  // Connects (two sessions: one for the queue's functions, one that only LISTENs), checks the
  // extension's version, LISTENs, then runs until stop(). Resolves once it listens.
  async start() {
    if (this._started) throw new Error('the worker was started already');
    this._started = true;
    // TCP keepalives: a peer gone without a word is noticed (the connection settings may turn
    // them off).
    const db = new Client({ application_name: this._appName, keepAlive: true, ...this._connection });
    const listener = new Client({ application_name: `${this._appName} (listen)`, keepAlive: true,
                                  ...this._connection });
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
  // handlers' signals and hands the events held back (due at once), waiting abortGrace seconds
  // at most for the handlers. Resolves when stopped.
  stop({ abort = false } = {}) {
    if (!this._stopping) this.emit('stopping', { abort });
    this._stopping = true;
    if (abort && !this._handingBack) {
      this._handingBack = true;
      for (const c of this._claims) c.abort(new Error(SHUTDOWN));
      this._abandonSoon();
    }
    this._wake();
    return this._done ? this._done : Promise.resolve();
  }

  _abandonSoon() {
    if (this._abandonTimer === null && !this._abandoned) {
      this._abandonTimer = setTimeout(() => this._abandonNow(), timerMs(this.abortGrace * 1000));
    }
  }

  _abandonNow() {
    clearTimeout(this._abandonTimer);
    this._abandoned = true;
    for (const waiter of this._abandonWaiters) waiter();
    this._abandonWaiters.clear();
  }

  // The outcome of a handler's run, or ABANDONED once the worker stops waiting for handlers.
  _outcome(run) {
    return new Promise((resolve) => {
      if (this._abandoned) return resolve(ABANDONED);
      const waiter = () => resolve(ABANDONED);
      this._abandonWaiters.add(waiter);
      run.then((outcome) => {
        this._abandonWaiters.delete(waiter);
        resolve(outcome);
      });
    });
  }

  _installSignals() {
    this._signalHandler = (signal) => {
      if (!this._stopping) {
        this._log(`${signal}: finishing the events held, then exiting`);
        this.stop();
      } else if (!this._handingBack) {
        this._log(`second ${signal}: handing the events held back`);
        this.stop({ abort: true });
      } else {
        // The hand-back itself hangs (a stalled connection): the claims end with their lease.
        this._log(`third ${signal}: exiting at once`);
        process.exit(128 + (os.constants.signals[signal] || 15));
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
    this._abandonSoon();
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
    this._abandonNow();   // what still runs is not waited for
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
      const timer = setTimeout(resolve, timerMs(ms));
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
      const { events, sentAt } = await this._claim();
      if (events.length > 0) {
        const p = this._work(events, sentAt)
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
    const { rows, sentAt } = await this._query(
      `SELECT * FROM throttle.${fn}($1, $2, make_interval(secs => $3), $4)`,
      [this.queue, this.workerName, this.lease, this.max]);
    if (rows.length > 0) this.emit('claimed', rows);
    return { events: rows, sentAt };
  }

  // { n: how many it renewed, sentAt }.
  async _extend(ids, token) {
    const { rows, sentAt } = await this._query(
      'SELECT throttle.extend($1::bigint[], $2::bigint, make_interval(secs => $3)) AS n',
      [ids, token, this.lease]);
    return { n: rows[0].n, sentAt };
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

  // The retry delay of a failed event: the error's own retryIn when it is a valid number of
  // seconds (null: the queue's backoff), else the worker's.
  _retryIn(error, ids) {
    let value;
    try {
      value = error !== null && typeof error === 'object' ? error.retryIn : undefined;
    } catch {
      value = undefined;   // a Proxy that throws
    }
    if (value === undefined) return this.retryIn;
    try {
      return seconds(value, 'error.retryIn', { allowNull: true });
    } catch (err) {
      this._log(`event(s) ${ids.join(',')}: ${err.message}; retrying after the worker's retryIn ` +
                `(${this.retryIn === null ? "the queue's backoff" : `${this.retryIn} s`})`);
      return this.retryIn;
    }
  }

  // Works through one claim's events in the order claim returned them (a group's in run_at
  // order), one at a time (or all at once with batch), ending each as soon as its work ends.
  // claimSentAt: when the claim was sent, the start of its lease as far as this worker knows.
  async _work(events, claimSentAt) {
    const token = events[0].claim_token;
    const held = new Set(events.map((e) => e.id));
    const abort = new AbortController();
    let lost = false;
    this._claims.add(abort);
    if (this._handingBack) abort.abort(new Error(SHUTDOWN));

    // Another worker may hold the events by now: stop their work, end none of them.
    const giveUp = (why) => {
      if (!lost) {
        this._log(`claim ${token} lost (${why}); stopping its work`);
        this.emit('lost', { token, reason: why, ids: [...held] });
      }
      lost = true;
      abort.abort(new Error('claim lost'));
    };

    // The local deadline: the lease runs from when the claim, or the last extend that renewed
    // every event, was sent. An extend that never answers (a stalled connection) cannot say
    // the claim is lost, so the deadline does, a margin before the lease may end.
    const leaseMs = this.lease * 1000;
    const marginMs = leaseMarginMs(this.lease);
    const deadline = new Deadline(claimSentAt + leaseMs - marginMs, () => {
      if (!lost) giveUp(`no extend answered within its lease of ${this.lease} s: it may have ended`);
    });
    const renewed = (sentAt) => deadline.extendTo(sentAt + leaseMs - marginMs);

    // The heartbeat. An id leaves `held` before its complete/fail is sent, and one session's
    // queries run in the order they are sent, so an extend never counts an event this worker
    // has ended.
    const heartbeat = setInterval(async () => {
      const ids = [...held];
      if (ids.length === 0 || lost) return;
      try {
        const { n, sentAt } = await this._extend(ids, token);
        if (n < ids.length) giveUp(`extended ${n} of ${ids.length}`);
        else renewed(sentAt);
      } catch (err) {
        giveUp(`extend failed: ${err.message}`);
      }
    }, timerMs(leaseMs / 3));

    // complete or fail; an SQL error (not one of the connection) gives the claim up: null.
    const end = async (what, ids, call) => {
      try {
        return await call();
      } catch (err) {
        if (isConnectionError(err)) throw err;
        giveUp(`${what} of ${ids.join(',')} raised ${err.code}: ${err.message}`);
        return null;
      }
    };

    const units = this.batch ? [events] : events.map((e) => [e]);
    const ctx = { signal: abort.signal, token, fence: token, queue: this.queue,
                  worker: this.workerName, claim: events };
    try {
      for (const unit of units) {
        if (lost || this._handingBack) break;
        const run = (async () => this._handler(this.batch ? unit : unit[0], ctx))().then(
          () => ({ ok: true }), (error) => ({ ok: false, error }));
        // After stop({ abort: true }) or a fatal error, a handler that ignores its signal is
        // waited for abortGrace seconds, no longer.
        const outcome = await this._outcome(run);
        const ids = unit.map((e) => e.id);
        if (outcome === ABANDONED) {
          this._log(`the handler of event(s) ${ids.join(',')} still runs ${this.abortGrace} s after ` +
                    'the abort: not waiting for it (its outcome will be ignored)');
          break;                                         // handed back below, unless fatal
        }
        if (lost) break;                                 // it may run elsewhere: end nothing
        if (this._handingBack && !outcome.ok) break;     // aborted: handed back below
        // A success stands even when an abort came meanwhile: complete it rather than hand
        // it back to run again.
        for (const id of ids) held.delete(id);
        if (outcome.ok) {
          const n = await end('complete', ids, () => this._complete(ids, token));
          if (n === null) continue;
          if (n < ids.length) giveUp(`complete of ${ids.join(',')} changed ${n}`);
          else for (const e of unit) this.emit('completed', e);
          continue;
        }
        const error = outcome.error;
        const message = errorMessage(error);
        for (const e of unit) this._log(`event ${e.id} (${e.item_key}) failed: ${message}`);
        const retryIn = this._retryIn(error, ids);
        const n = await end('fail', ids, () => this._fail(ids, token, message, retryIn));
        if (n === null) continue;
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
          let got;
          try {
            got = await this._extend(rest, token);
          } catch (err) {
            giveUp(`extend failed: ${err.message}`);
          }
          if (got !== undefined && got.n < rest.length) {
            this._log(`claim ${token}: after the failure of ${ids.join(',')}, extend renewed ${got.n} ` +
                      `of its ${rest.length} later events: they are no longer held (strict order hands ` +
                      'them back after a failure, or the lease ended); leaving them');
            this.emit('left', { token, ids: rest });
            lost = true;   // nothing of this claim is handled, completed or failed any more
          } else if (got !== undefined) {
            renewed(got.sentAt);
          }
        }
      }
      if (this._handingBack && !lost && held.size > 0 && !this._fatal) {
        // Pending again at once, for another worker (the attempt stays counted).
        const ids = [...held];
        held.clear();
        clearInterval(heartbeat);   // extend them no more
        const n = await end('fail', ids, () => this._fail(ids, token, SHUTDOWN, 0));
        if (n !== null) {
          this._log(`handed back ${n} event(s)`);
          this.emit('handedBack', { token, ids, count: n });
        }
      }
    } finally {
      clearInterval(heartbeat);
      deadline.clear();
      this._claims.delete(abort);
    }
  }
}

module.exports = { Worker };
