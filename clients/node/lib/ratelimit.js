'use strict';
// Rate limits over HTTP: take() calls throttle.take on a token bucket; rateLimit() is a
// middleware for Express-style (req, res, next) handlers and withRateLimit() wraps a plain
// Node http handler. Each request is keyed by a function (by default its X-Api-Key header,
// else its address); the bucket holds `burst` requests and refills at `rate` per `per`
// seconds. Every answer carries RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset; a
// refused request gets 429 with Retry-After. The bucket lives in the server's shared memory,
// so every process of the application shares it.

const { ensureVersion } = require('./version');
const { seconds } = require('./util');

const MAX_KEY_BYTES = 200;   // pg_throttle's longest bucket name

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
//   rate, per (seconds), burst (default rate), cost (default 1, or a function of req),
//   key(req) -> string | null (default: X-Api-Key, else the client's address),
//   log(message) for refusals and database errors (default: none).
// A key longer than 200 bytes gets 400; a request without a key (its connection is already
// gone) gets 400; when the database cannot answer, 503 with Retry-After 1 (fail closed).
function rateLimit(db, options) {
  const { rate, per, burst = rate, cost = 1, key = defaultKey, log = () => {} } = options || {};
  if (!Number.isInteger(rate) || rate < 1) throw new RangeError('rate must be an integer >= 1');
  if (!Number.isInteger(burst) || burst < 1) throw new RangeError('burst must be an integer >= 1');
  seconds(per, 'per', { positive: true });
  return async function pgThrottleRateLimit(req, res, next) {
    const name = key(req);
    if (name === null || name === undefined || name === '') {
      log(`${req.method} ${req.url}: no rate-limit key (no client address: the connection is closed); refused`);
      return send(res, 400, { error: 'no client address' });
    }
    if (Buffer.byteLength(name) > MAX_KEY_BYTES) {
      return send(res, 400, { error: 'rate-limit key too long' });
    }
    let answer;
    try {
      answer = await take(db, name, { rate, per, burst,
                                      cost: typeof cost === 'function' ? cost(req) : cost });
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
function withRateLimit(db, options, handler) {
  const limit = rateLimit(db, options);
  return (req, res) => limit(req, res, (err) => {
    if (err) return send(res, 500, { error: 'internal error' });
    return handler(req, res);
  });
}

module.exports = { take, rateLimit, withRateLimit, defaultKey, MAX_KEY_BYTES };
