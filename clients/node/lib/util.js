'use strict';
// Small helpers shared by the modules.

// A promise that resolves after `ms`, or rejects with the signal's reason once it aborts.
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

// The longest duration taken, in seconds (about 3170 years): make_interval(secs => n) wraps
// around past 9.2e12 s, into a negative interval.
const MAX_SECONDS = 1e11;

// Seconds for make_interval(secs => $n): a finite, non-negative number up to MAX_SECONDS, or
// null.
function seconds(value, name, { allowNull = false, positive = false } = {}) {
  if (value === null || value === undefined) {
    if (allowNull) return null;
    throw new TypeError(`${name} is required (seconds)`);
  }
  const n = ['number', 'string', 'bigint'].includes(typeof value) ? Number(value) : NaN;
  if (!Number.isFinite(n) || n < 0 || (positive && n === 0) || n > MAX_SECONDS) {
    throw new RangeError(`${name} must be a ${positive ? 'positive' : 'non-negative'} number of seconds ` +
                         `(at most ${MAX_SECONDS}), not ${errorMessage(value)}`);
  }
  return n;
}

// A run_at for timestamptz: a Date, or a string PostgreSQL reads; null or undefined: now.
function timestamp(value, name) {
  if (value === null || value === undefined) return null;
  if (value instanceof Date) {
    if (Number.isNaN(value.getTime())) throw new RangeError(`${name} is an invalid Date`);
    return value.toISOString();
  }
  if (typeof value === 'string') return value;
  throw new TypeError(`${name} must be a Date or a timestamp string`);
}

// setTimeout and setInterval take at most 2^31 - 1 ms (24.8 days): a longer delay fires after
// 1 ms instead (with a TimeoutOverflowWarning). Every delay goes through this.
const MAX_TIMER_MS = 2 ** 31 - 1;
function timerMs(ms) {
  return Math.min(Math.max(ms, 1), MAX_TIMER_MS);
}

// A local deadline on a monotonic clock (performance.now(), in ms): onExpire runs once when it
// passes without having been moved later. Used for a lease whose renewal may never answer (a
// stalled connection): its holder must give it up on its own once it may have ended.
class Deadline {
  constructor(at, onExpire) {
    this._at = at;
    this._onExpire = onExpire;
    this._timer = null;
    this.expired = false;
    this._arm();
  }

  // Moves the deadline to `at` when that is later (the answer of an older renewal changes
  // nothing).
  extendTo(at) {
    if (this.expired || this._timer === null || at <= this._at) return;
    this._at = at;
  }

  // Whether it has passed; one passed whose timer has not fired yet (a busy event loop)
  // expires now.
  passed() {
    if (!this.expired && this._timer !== null && performance.now() >= this._at) {
      clearTimeout(this._timer);
      this._timer = null;
      this.expired = true;
      this._onExpire();
    }
    return this.expired;
  }

  _arm() {
    const left = this._at - performance.now();
    if (left <= 0) {
      this._timer = null;
      this.expired = true;
      this._onExpire();
      return;
    }
    this._timer = setTimeout(() => this._arm(), timerMs(left));
  }

  clear() {
    clearTimeout(this._timer);
    this._timer = null;
  }
}

// The margin a lease's holder keeps before the lease's end, as it reckons it: a sixth of the
// lease, at most 2 s.
function leaseMarginMs(leaseS) {
  return Math.min((leaseS * 1000) / 6, 2000);
}

// A message for any thrown value: an Error's message, else the value as a string. Never
// throws (Object.create(null) has no toString, a revoked Proxy throws on every access), and
// has no NUL character (PostgreSQL's text refuses it).
function errorMessage(value) {
  let text;
  try {
    const message = value !== null && (typeof value === 'object' || typeof value === 'function')
      ? value.message : undefined;
    text = message !== undefined && message !== null && message !== '' ? String(message) : String(value);
  } catch {
    try {
      text = Object.prototype.toString.call(value);
    } catch {
      text = 'a thrown value that cannot be described';
    }
  }
  return text.replace(/\u0000/g, '\uFFFD');
}

// A retry's delay: base * 2^(attempt - 1), at most cap, times a random factor from 0.5 to 1.5
// (so that workers that collided do not collide again), in ms.
function backoffMs(attempt, base, cap) {
  return Math.round(Math.min(base * 2 ** (attempt - 1), cap) * (0.5 + Math.random()));
}

module.exports = { sleep, backoffMs, seconds, timestamp, timerMs, MAX_TIMER_MS, Deadline, leaseMarginMs,
                   errorMessage };
