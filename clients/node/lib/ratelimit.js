'use strict';
// Rate limits over HTTP: take() calls throttle.take on a token bucket; rateLimit() is a
// middleware for Express-style (req, res, next) handlers and withRateLimit() wraps a plain
// Node http handler. Each request is keyed by a function (by default its X-Api-Key header,
// else its address); the bucket holds `burst` requests and refills at `rate` per `per`
// seconds. Every answer carries RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset; a
// refused request gets 429 with Retry-After. The bucket lives in the server's shared memory,
// so every process of the application shares it.

const { ensureVersion } = require('./version');
const { seconds, errorMessage } = require('./util');

const MAX_KEY_BYTES = 200;   // pg_throttle's longest bucket name
const MAX_INT = 2 ** 31 - 1; // rate, burst and cost are SQL integers

// A cost take can grant: an integer from 0 to burst (a cost above burst could never pass;
// take refuses it, and every request would get 503).
function checkCost(cost, burst, name = 'cost') {
  if (!Number.isInteger(cost) || cost < 0 || cost > burst) {
    throw new RangeError(`${name} must be an integer from 0 to burst (${burst}), not ${String(cost)}`);
  }
  return cost;
}

// The bucket name of a key function's answer: a string; a number or bigint (a user id) as its
// decimal text; null or undefined or '': none. Anything else is the key function's bug.
function keyName(name) {
  if (name === null || name === undefined || name === '') return null;
  if (typeof name === 'string') return name;
  if ((typeof name === 'number' && Number.isFinite(name)) || typeof name === 'bigint') return String(name);
  throw new TypeError(`the rate-limit key function returned ${typeof name}, not a string`);
}

// throttle.take: { allowed, remaining, retryAfter, resetAfter } (seconds, as numbers).
async function take(db, key, { rate, per, burst = null, cost = 1 }) {
  await ensureVersion(db);
  // SELECT ... FROM take(...): one call. (take(...)).* in a select list would take one unit
  // per output column.
  const { rows: [row] } = await db.query(
    'SELECT allowed, remaining, extract(epoch FROM retry_after) AS retry_after_s, ' +
    '       extract(epoch FROM reset_after) AS reset_after_s ' +
    'FROM throttle.take($1, $2, make_interval(secs => $3), $4, $5)',
    [key, rate, seconds(per, 'per', { positive: true }), burst, cost]);
  return {
    allowed: row.allowed,
    remaining: row.remaining,
    retryAfter: Number(row.retry_after_s),
    resetAfter: Number(row.reset_after_s),
  };
}

// The key of a request's bucket, or null when the request has none. Check an API key before
// you key by it: anyone can send any header, and an unchecked key lets a client pick a fresh
// bucket for every request.
function defaultKey(req) {
  const apiKey = req.headers['x-api-key'];
  if (apiKey) return `api:key:${apiKey}`;
  // remoteAddress is undefined once the connection is closed or reset: keyed as "undefined",
  // all such requests would share one bucket.
  const address = req.socket && req.socket.remoteAddress;
  return address ? `api:addr:${address}` : null;
}

function send(res, status, body, headers = {}) {
  res.writeHead(status, { 'Content-Type': 'application/json', ...headers });
  res.end(JSON.stringify(body) + '\n');
}

// Express-style middleware: answers 400, 429 or 503 itself, or calls next() when the request
// may pass (req.rateLimit then holds take()'s answer).
//   rate, per (seconds), burst (default rate), cost (default 1, or a function of req: an
//   integer from 0 to burst), key(req) -> string | number | null (default: X-Api-Key, else
//   the client's address), log(message) for refusals and errors (default: none).
// A key longer than 200 bytes gets 400; a request without a key (its connection is already
// gone) gets 400; when the database cannot answer, 503 with Retry-After 1 (fail closed). A key
// or cost function that throws or answers something else is a bug of the application's:
// next(err) (Express answers 500; withRateLimit too).
function rateLimit(db, options) {
  const { rate, per, burst = rate, cost = 1, key = defaultKey, log = () => {} } = options || {};
  if (!Number.isInteger(rate) || rate < 1 || rate > MAX_INT) {
    throw new RangeError(`rate must be an integer from 1 to ${MAX_INT}`);
  }
  if (!Number.isInteger(burst) || burst < 1 || burst > MAX_INT) {
    throw new RangeError(`burst must be an integer from 1 to ${MAX_INT}`);
  }
  seconds(per, 'per', { positive: true });
  if (typeof cost !== 'function') checkCost(cost, burst);
  if (typeof key !== 'function') throw new TypeError('key must be a function');
  return async function pgThrottleRateLimit(req, res, next) {
    let name;
    let units;
    try {
      name = keyName(key(req));
      units = typeof cost === 'function' ? checkCost(cost(req), burst, 'cost(req)') : cost;
    } catch (err) {
      return next(err);
    }
    if (name === null) {
      log(`${req.method} ${req.url}: no rate-limit key (no client address: the connection is closed); refused`);
      return send(res, 400, { error: 'no client address' });
    }
    if (Buffer.byteLength(name) > MAX_KEY_BYTES) {
      return send(res, 400, { error: 'rate-limit key too long' });
    }
    let answer;
    try {
      answer = await take(db, name, { rate, per, burst, cost: units });
    } catch (err) {
      // Fail closed: without the database the limit cannot be checked.
      log(`rate limit check failed: ${err.message}`);
      return send(res, 503, { error: 'rate limit unavailable' }, { 'Retry-After': '1' });
    }
    // Headers take whole seconds, rounded UP (0.4 s rounded to the nearest would tell the
    // client to come back at once).
    res.setHeader('RateLimit-Limit', String(burst));
    res.setHeader('RateLimit-Remaining', String(answer.remaining));
    res.setHeader('RateLimit-Reset', String(Math.ceil(answer.resetAfter)));
    if (!answer.allowed) {
      const retryAfter = Math.max(1, Math.ceil(answer.retryAfter));
      return send(res, 429, { error: 'rate limited', retry_after_s: answer.retryAfter },
                  { 'Retry-After': String(retryAfter) });
    }
    req.rateLimit = answer;
    return next();
  };
}

// A plain Node http handler (req, res) that runs `handler` only for requests the limit lets
// pass: http.createServer(withRateLimit(pool, { rate: 100, per: 60, burst: 20 }, handler)).
// An error (of the key or cost function, or one the handler throws or rejects with) is
// logged and answered with 500, never left to crash the process as an unhandled rejection.
function withRateLimit(db, options, handler) {
  const limit = rateLimit(db, options);
  const log = (options && options.log) || (() => {});
  return (req, res) => {
    const fail = (err) => {
      log(`${req.method} ${req.url}: internal error: ${errorMessage(err)}`);
      if (!res.headersSent) send(res, 500, { error: 'internal error' });
      else res.destroy();
    };
    limit(req, res, (err) => {
      if (err) return fail(err);
      return handler(req, res);
    }).catch(fail);
  };
}

module.exports = { take, rateLimit, withRateLimit, defaultKey, MAX_KEY_BYTES };
