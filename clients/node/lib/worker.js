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
// may have ended, and another worker may run the events. Nothing is sent for a claim given up.
// A query of the worker's session that gets no answer within queryTimeout sets off a probe of
// its backend in pg_stat_activity, through the listening session: a backend still active
// (running, or waiting on a lock) is waited for; one idle or gone (the answer was lost), or no
// answer to the probe, stops the worker (wait() rejects, so that a supervisor restarts it), and
// so does a connection error. A query the worker gives up on while its backend still works is
// cancelled first (pg_cancel_backend), so that a claim rolls back. A claim that raises a
// transient SQL error (class 40 or 53, 55P03, 57014) is sent again after a pause; any other
// SQL error of claim stops the worker, after the claims in progress end. complete, fail and
// extend are sent again after a serialization failure or deadlock (class 40); any other SQL
// error of theirs only gives the claim up. After a failure in a group claim, the claim's later
// events are extended before they are handled: in a group kept in strict order the fail handed
// them back (they run after the failed event's retry), and an extend that renews fewer says
// so; the worker leaves them.
//
// stop() claims nothing more and finishes the events held; stop({ abort: true }), or a fatal
// error, aborts the handlers and hands the events held back with fail(..., retry_in => '0')
// (an event whose handler succeeds within abortGrace seconds is completed instead); a handler
// still running after abortGrace is not waited for: its events are handed back and its late
// outcome is ignored, and a claim still waiting (on a lock) is cancelled. With handleSignals, SIGTERM or SIGINT does the first, a second one the second, and a
// third exits the process at once.
//
// claim_token and id are bigint: they stay strings, passed back as they are.

const EventEmitter = require('node:events');
const os = require('node:os');
const { Client } = require('pg');
const { ensureVersion } = require('./version');
const { sleep, backoffMs, seconds, timerMs, Deadline, leaseMarginMs, errorMessage } = require('./util');

const SHUTDOWN = 'worker shutting down';
const ABANDONED = Symbol('abandoned');   // a handler (or claim) not waited for any more
const TIMED_OUT = Symbol('timed out');
const NOT_SENT = 'PG_THROTTLE_NOT_SENT';   // a claim's query not sent: the claim was given up
const END_RETRIES = 4;                   // tries of a complete, fail or extend (class 40 errors)
const MAX_QUEUE_BYTES = 63;              // pg_throttle's longest queue name (also a channel)

// An error of the session itself (lost, cut, timed out), as opposed to one the server raised
// for a statement (a DatabaseError with its SQLSTATE) on a session that still works.
function isConnectionError(err) {
  const code = err && typeof err === 'object' ? err.code : undefined;
  const fromServer = typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) && 'severity' in err;
  return !fromServer || code.startsWith('08') || code.startsWith('57P');
}

// An SQL error of a statement that rolled back and may well succeed when sent again: a
// serialization failure or deadlock (class 40), a lock not available (55P03), a cancelled
// statement (57014, statement_timeout), insufficient resources (class 53).
function isTransient(err) {
  if (isConnectionError(err)) return false;
  const code = err.code;
  return code.startsWith('40') || code.startsWith('53') || code === '55P03' || code === '57014';
}

// A serialization failure or deadlock: the statement rolled back, sending it again is safe.
function isClass40(err) {
  return !isConnectionError(err) && err.code.startsWith('40');
}

// p's value, or TIMED_OUT after ms (p's late outcome is ignored).
function within(p, ms) {
  let timer;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise((resolve) => { timer = setTimeout(() => resolve(TIMED_OUT), timerMs(ms)); }),
  ]);
}

// What the watchdog asks about the worker's session's backend, through the listening session.
const PROBE = `SELECT state, wait_event_type, wait_event FROM pg_stat_activity WHERE pid = $1`;

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
    this._backendPid = null;          // the queue's session's backend
    this._current = null;             // its query in progress: { settled }
    this._listenerBusy = false;       // a probe or cancel in progress on the listening session
    this._stopCtl = new AbortController();   // aborts backoff sleeps at stop() or a fatal error
    // abortGrace seconds after stop({ abort: true }) or a fatal error, the handlers still
    // running are not waited for any more: their waiters are called.
    this._abandoned = false;
    this._abandonWaiters = new Set();
    this._abandonTimer = null;
  }

  // One session's queries, sent one after the other in the order they are asked for (the
  // heartbeat relies on that order; node-postgres deprecates queueing them itself). The result
  // has `sentAt`: when the query went out (performance.now()). guard, when given, runs just
  // before the query would be sent: a reason it returns rejects the query unsent (code
  // PG_THROTTLE_NOT_SENT). A query with no answer within queryTimeout sets off the watchdog.
  _query(sql, params, guard) {
    const p = this._tail.then(() => {
      const why = guard ? guard() : null;
      if (why) throw Object.assign(new Error(`not sent: ${why}`), { code: NOT_SENT });
      const sentAt = performance.now();
      const current = { settled: false, sentAt };
      this._current = current;
      const unwatch = this._watch(current);
      const settle = () => {
        current.settled = true;
        unwatch();
        if (this._current === current) this._current = null;
      };
      return this._db.query(sql, params).then(
        (result) => { settle(); result.sentAt = sentAt; return result; },
        (err) => { settle(); throw err; });
    });
    this._tail = p.catch(() => {});
    return p;
  }

  // The watchdog of a query in progress: every queryTimeout without an answer, it asks the
  // server, through the listening session, what the session's backend does. Active (running,
  // or waiting on a lock: a healthy server, slow): it waits on. Idle or gone (the answer was
  // lost), waiting to send the answer (ClientWrite), or no answer to the probe itself within
  // queryTimeout / 2: the connection is stalled, and the worker stops.
  _watch(current) {
    let timer = null;
    let done = false;
    const check = async () => {
      if (done || this._fatal) return;
      const probe = await this._probe();
      if (done || current.settled || this._fatal) return;
      const waited = ((performance.now() - current.sentAt) / 1000).toFixed(1);
      if (probe.waiting) {
        this._log(`a query of the worker's session waits on the server (${probe.waiting}) after ${waited} s, ` +
                  'past queryTimeout: the server is working on it; waiting');
        timer = setTimeout(check, timerMs(this.queryTimeout * 1000));
        return;
      }
      if (probe.idle) {
        // Its answer may be on its way still: a moment for it.
        await sleep(Math.min(500, this.queryTimeout * 500));
        if (done || current.settled || this._fatal) return;
      }
      this._stalled(probe.reason, probe.live);
    };
    timer = setTimeout(check, timerMs(this.queryTimeout * 1000));
    return () => { done = true; clearTimeout(timer); };
  }

  // A query of the listening session, answered within ms: its rows, or TIMED_OUT (also when a
  // query of it is still in progress, or it fails).
  async _listenerQuery(sql, params, ms) {
    if (this._listenerBusy) return TIMED_OUT;
    this._listenerBusy = true;
    const q = this._listener.query(sql, params).then(
      (r) => r.rows, () => TIMED_OUT).finally(() => { this._listenerBusy = false; });
    return within(q, ms);
  }

  async _probe() {
    const ms = this.queryTimeout * 500;
    const rows = await this._listenerQuery(PROBE, [this._backendPid], ms);
    if (rows === TIMED_OUT) {
      return { reason: `the probe of its backend through the listening session got no answer within ${ms / 1000} s` };
    }
    const row = rows[0];
    if (!row) return { idle: true, reason: `its backend is absent (pid ${this._backendPid}): the answer was lost` };
    if (row.state === 'active' && row.wait_event_type !== 'Client') {
      return { waiting: row.wait_event_type ? `${row.wait_event_type}: ${row.wait_event}` : 'running' };
    }
    if (row.state === 'active') {
      return { live: true, reason: `its backend waits on the connection (${row.wait_event})` };
    }
    return { idle: true, reason: `its backend is ${row.state}: the answer was lost` };
  }

  // pg_cancel_backend of the queue's session's query in progress, through the listening
  // session: a claim rolls back instead of committing for a worker that gave it up.
  async _cancelInProgress(why) {
    const current = this._current;
    if (current === null || current.settled || this._backendPid === null) return;
    const rows = await this._listenerQuery('SELECT pg_cancel_backend($1) AS ok', [this._backendPid],
                                           Math.min(this.queryTimeout * 500, 2000));
    if (rows !== TIMED_OUT && rows[0].ok) {
      this._log(`cancelled its query in progress (pg_cancel_backend(${this._backendPid})): ${why}`);
    }
  }

  _stalled(reason, live) {
    const err = new Error(`the worker's session answered no query within ${this.queryTimeout} s ` +
                          `(queryTimeout), and ${reason}: the connection is stalled`);
    err.code = 'PG_THROTTLE_STALLED';
    this._die(err, `${err.message}; stopping`);
    // With a query in progress, end() destroys the socket: every query waiting rejects.
    const cancel = live ? this._cancelInProgress('the connection is stalled') : Promise.resolve();
    cancel.finally(() => this._db.end().catch(() => {}));
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
    const keepAlive = { keepAlive: true, keepAliveInitialDelayMillis: 10000 };
    const db = new Client({ application_name: this._appName, ...keepAlive, ...this._connection });
    const listener = new Client({ application_name: `${this._appName} (listen)`, ...keepAlive,
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
      this._backendPid = (await db.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
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
      async (err) => {
        this._die(err, `fatal: ${err.stack || err}`);
        await this._settleInflight();
        await this._finish();
        throw this._fatal;
      });
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
    this._stopCtl.abort();
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

  // p's outcome, or ABANDONED once the worker stops waiting for handlers (and claims).
  _outcome(p) {
    return new Promise((resolve, reject) => {
      if (this._abandoned) return resolve(ABANDONED);
      const waiter = () => resolve(ABANDONED);
      this._abandonWaiters.add(waiter);
      p.then((outcome) => {
        this._abandonWaiters.delete(waiter);
        resolve(outcome);
      }, (err) => {
        this._abandonWaiters.delete(waiter);
        reject(err);
      });
    });
  }

  // After a fatal error: the claims in progress end (handlers are waited for abortGrace
  // seconds, as at stop({ abort: true })), their queries answered within queryTimeout more.
  async _settleInflight() {
    const bound = (this.abortGrace + this.queryTimeout) * 1000;
    await within(Promise.allSettled([...this._inflight]), bound);
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
    this._stopCtl.abort();
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
    // A query still in progress (a claim waiting on a lock, after abortGrace): cancelled, so
    // that it does not commit a claim for a worker that is gone.
    await this._cancelInProgress('the worker stops');
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
    let failures = 0;          // transient errors of claim in a row
    const pollMs = this.pollSeconds * 1000;
    while (!this._stopping) {
      if (this._inflight.size >= this.concurrency) {
        this._woken = false;   // a finished claim, or stop(), wakes this
        await this._idle(pollMs);
        continue;
      }
      this._woken = false;     // a NOTIFY from now on wakes the idle() after this claim
      const claim = this._claim();
      let got;
      try {
        // A claim waiting on a lock is not waited for past abortGrace after
        // stop({ abort: true }) or a fatal error: _close() cancels it.
        got = await this._outcome(claim);
      } catch (err) {
        if (!isTransient(err)) throw err;
        // The claim rolled back; the session works: claim again, after a pause with jitter.
        const ms = backoffMs(++failures, 50, 2000);
        this._log(`claim raised ${err.code} (${err.message}): claiming again in ${ms} ms`);
        await sleep(ms, this._stopCtl.signal).catch(() => {});
        continue;
      }
      if (got === ABANDONED) {
        claim.then(({ events }) => {
          if (events.length > 0) {
            this._log(`a claim answered after the worker stopped waiting for it: event(s) ` +
                      `${events.map((e) => e.id).join(',')} end with their lease`);
          }
        }, () => {});
        break;
      }
      failures = 0;
      const { events, sentAt } = got;
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
      [this.queue, this.workerName, this.lease, this.max], () => (this._abandoned ? 'the worker stops' : null));
    if (rows.length > 0) this.emit('claimed', rows);
    return { events: rows, sentAt };
  }

  // { n: how many it renewed, sentAt }.
  // guard: as _query's (the claim's queries are not sent once it was given up).
  async _extend(ids, token, guard) {
    const { rows, sentAt } = await this._query(
      'SELECT throttle.extend($1::bigint[], $2::bigint, make_interval(secs => $3)) AS n',
      [ids, token, this.lease], guard);
    return { n: rows[0].n, sentAt };
  }

  async _complete(ids, token, guard) {
    const { rows } = await this._query(
      'SELECT throttle.complete($1::bigint[], $2::bigint) AS n', [ids, token], guard);
    return rows[0].n;
  }

  async _fail(ids, token, error, retryIn, guard) {
    const { rows } = await this._query(
      'SELECT throttle.fail($1::bigint[], $2::bigint, $3, make_interval(secs => $4)) AS n',
      [ids, token, error, retryIn], guard);
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
    let lost = false;              // given up, or left: nothing of it is sent any more
    let gaveUp = false;            // given up (event 'lost'): its late answers are not reported
    let ended = false;             // the claim's work is over: no more heartbeats
    let groupFailSent = false;     // a fail of a group's event was sent (strict order)
    this._claims.add(abort);
    if (this._givingBack()) abort.abort(new Error(SHUTDOWN));

    // Another worker may hold the events by now: stop their work, end none of them.
    const giveUp = (why) => {
      if (!lost) {
        this._log(`claim ${token} lost (${why}); stopping its work`);
        this.emit('lost', { token, reason: why, ids: [...held] });
      }
      lost = true;
      gaveUp = true;
      abort.abort(new Error('claim lost'));
    };
    // After a failure in a group kept in strict order, the claim's later events were handed
    // back (they run after the failed event's retry): not lost, left.
    const leave = (ids, n, after) => {
      if (lost) return;
      this._log(`claim ${token}: after the failure of ${after}, extend renewed ${n} of its ${ids.length} ` +
                'later events: they are no longer held (strict order hands them back after a failure, or ' +
                'the lease ended); leaving them');
      this.emit('left', { token, ids });
      lost = true;   // nothing of this claim is handled, completed or failed any more
    };

    // The local deadline: the lease runs from when the claim, or the last extend that renewed
    // every event, was sent. An extend that never answers (a stalled connection) cannot say
    // the claim is lost, so the deadline does, a margin before the lease may end.
    const leaseMs = this.lease * 1000;
    const marginMs = leaseMarginMs(this.lease);
    const deadline = new Deadline(claimSentAt + leaseMs - marginMs, () => {
      if (!lost) giveUp(`no extend answered within its lease of ${this.lease} s: it may have ended`);
    });
    let renewedAt = claimSentAt;   // when the last extend that renewed everything was sent
    const renewed = (sentAt) => {
      deadline.extendTo(sentAt + leaseMs - marginMs);
      renewedAt = Math.max(renewedAt, sentAt);
    };
    // Checked just before each of the claim's queries is sent (they may wait behind others in
    // the session): nothing is sent for a claim given up.
    const unsent = () => (lost || deadline.passed() ? 'the claim was given up' : null);

    // A complete, fail or extend that raises a serialization failure or deadlock (class 40)
    // rolled back: sent again a few times, after a short pause, while the claim stands (complete
    // and fail act only for the claim's token).
    const retrying = async (what, call) => {
      for (let attempt = 1; ; attempt++) {
        try {
          return await call();
        } catch (err) {
          if (!isClass40(err) || attempt >= END_RETRIES || unsent()) throw err;
          const ms = backoffMs(attempt, 25, 400);
          this._log(`${what} of claim ${token} raised ${err.code} (${err.message}): sending it again in ${ms} ms`);
          await sleep(ms);
        }
      }
    };

    // The heartbeat: an extend lease/3 after the claim, or the last extend that renewed
    // everything, was sent; one at a time (none queued behind one unanswered). An id leaves
    // `held` before its complete/fail is sent, and one session's queries run in the order they
    // are sent, so an extend never counts an event this worker has ended.
    let beatTimer = null;
    const scheduleBeat = () => {
      if (ended || lost) return;
      beatTimer = setTimeout(beat, timerMs(renewedAt + leaseMs / 3 - performance.now()));
    };
    const beat = async () => {
      beatTimer = null;
      const ids = [...held];
      if (ids.length === 0 || lost || ended) return;
      let afterGroupFail = false;
      const guard = () => { afterGroupFail = groupFailSent; return unsent(); };
      try {
        const { n, sentAt } = await retrying('extend', () => this._extend(ids, token, guard));
        if (n < ids.length && afterGroupFail) leave(ids, n, 'an event of its group');
        else if (n < ids.length) giveUp(`extended ${n} of ${ids.length}`);
        else renewed(sentAt);
      } catch (err) {
        if (err.code !== NOT_SENT) giveUp(`extend failed: ${err.message}`);
        return;
      }
      scheduleBeat();
    };
    scheduleBeat();

    // complete or fail; an SQL error (not one of the connection) gives the claim up: null;
    // so does one not sent (the claim was given up while it waited to be sent).
    const end = async (what, ids, call) => {
      try {
        return await retrying(what, call);
      } catch (err) {
        if (err.code === NOT_SENT) {
          this._log(`${what} of ${ids.join(',')} not sent: the claim was given up`);
          return null;
        }
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
        if (lost || this._givingBack()) break;
        const run = (async () => this._handler(this.batch ? unit : unit[0], ctx))().then(
          () => ({ ok: true }), (error) => ({ ok: false, error }));
        // After stop({ abort: true }) or a fatal error, a handler that ignores its signal is
        // waited for abortGrace seconds, no longer.
        const outcome = await this._outcome(run);
        const ids = unit.map((e) => e.id);
        if (outcome === ABANDONED) {
          this._log(`the handler of event(s) ${ids.join(',')} still runs ${this.abortGrace} s after ` +
                    'the abort: not waiting for it (its outcome will be ignored)');
          break;                                         // handed back below
        }
        if (lost || unsent()) break;                     // it may run elsewhere: end nothing
        if (this._givingBack() && !outcome.ok) break;    // aborted: handed back below
        // A success stands even when an abort came meanwhile: complete it rather than hand
        // it back to run again.
        for (const id of ids) held.delete(id);
        if (outcome.ok) {
          const n = await end('complete', ids, () => this._complete(ids, token, unsent));
          if (n === null) continue;
          if (n < ids.length) giveUp(`complete of ${ids.join(',')} changed ${n}`);
          else if (gaveUp) this._log(`complete of ${ids.join(',')} answered after the claim was given up (not reported as completed)`);
          else for (const e of unit) this.emit('completed', e);
          continue;
        }
        const error = outcome.error;
        const message = errorMessage(error);
        for (const e of unit) this._log(`event ${e.id} (${e.item_key}) failed: ${message}`);
        const retryIn = this._retryIn(error, ids);
        const inGroup = unit.some((e) => e.group_key !== null);
        const guard = () => {
          const why = unsent();
          if (!why && inGroup) groupFailSent = true;
          return why;
        };
        const n = await end('fail', ids, () => this._fail(ids, token, message, retryIn, guard));
        if (n === null) continue;
        if (n < ids.length) {
          giveUp(`fail of ${ids.join(',')} changed ${n}`);
          continue;
        }
        if (gaveUp) {
          this._log(`fail of ${ids.join(',')} answered after the claim was given up (not reported as failed)`);
          continue;
        }
        for (const e of unit) this.emit('failed', e, error);
        if (inGroup && held.size > 0 && !lost) {
          // In a group in strict order the failure handed the claim's later events back:
          // they run after this one's retry, and handling them now would break the order
          // (complete would refuse them anyway). extend renews only what the claim holds.
          const rest = [...held];
          let got;
          try {
            got = await retrying('extend', () => this._extend(rest, token, unsent));
          } catch (err) {
            if (err.code !== NOT_SENT) giveUp(`extend failed: ${err.message}`);
          }
          if (got !== undefined && got.n < rest.length) leave(rest, got.n, ids.join(','));
          else if (got !== undefined) renewed(got.sentAt);
        }
      }
      if (this._givingBack() && !lost && held.size > 0) {
        // Pending again at once, for another worker (the attempt stays counted).
        const ids = [...held];
        held.clear();
        ended = true;
        clearTimeout(beatTimer);   // extend them no more
        const n = await end('fail', ids, () => this._fail(ids, token, SHUTDOWN, 0, unsent));
        if (n !== null) {
          this._log(`handed back ${n} event(s)`);
          this.emit('handedBack', { token, ids, count: n });
        }
      }
    } finally {
      ended = true;
      clearTimeout(beatTimer);
      deadline.clear();
      this._claims.delete(abort);
    }
  }

  // Whether the events held are handed back rather than worked on: after stop({ abort: true })
  // or a fatal error.
  _givingBack() {
    return this._handingBack || this._fatal !== null;
  }
}

module.exports = { Worker };
