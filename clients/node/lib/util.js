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

// Seconds for make_interval(secs => $n): a finite, non-negative number, or null.
function seconds(value, name, { allowNull = false, positive = false } = {}) {
  if (value === null || value === undefined) {
    if (allowNull) return null;
    throw new TypeError(`${name} is required (seconds)`);
  }
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0 || (positive && n === 0)) {
    throw new RangeError(`${name} must be a ${positive ? 'positive' : 'non-negative'} number of seconds, not ${value}`);
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

module.exports = { sleep, seconds, timestamp };
