#!/usr/bin/env node
// An HTTP server with a pg_throttle rate limit in front of its handler, with node-postgres.
//
//   node ratelimit_server.js [--port 8080] [--rate 100] [--per 60] [--burst 20]
//
// Connects with the libpq environment (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE) and
// listens on 127.0.0.1 (--port 0: a free port, printed on stdout). Each client has a bucket
// of --burst requests that refills at --rate per --per seconds, keyed by its X-Api-Key
// header, else its address (400 when its connection is already closed, or when the key
// would make a bucket name longer than pg_throttle's 200 bytes). Every answer carries
// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset; a refused request gets 429 with
// Retry-After. The bucket lives in the server's shared memory, so every process of the
// application shares it.
'use strict';

const http = require('node:http');
const { parseArgs } = require('node:util');
const { Pool } = require('pg');

const { values: opts } = parseArgs({
  options: {
    port: { type: 'string', default: '8080' },
    rate: { type: 'string', default: '100' },
    per: { type: 'string', default: '60' },     // seconds
    burst: { type: 'string', default: '20' },
  },
});

// The key of a request's bucket, or null when the request has none. A real server would
// check the API key first: anyone can send any header, and an unchecked key lets a client
// pick a fresh bucket for every request.
function clientKey(req) {
  const apiKey = req.headers['x-api-key'];
  if (apiKey) return `api:key:${apiKey}`;
  // remoteAddress is undefined once the connection is closed or reset (a request read
  // before its reset still gets here): keyed as "undefined", all such requests would
  // share one bucket, and drain it for everyone else who has no address either.
  const address = req.socket.remoteAddress;
  return address ? `api:addr:${address}` : null;
}

// Middleware: answers 400 or 429 itself, or calls next() when the request may pass.
function rateLimit(pool, { rate, per, burst }) {
  return async (req, res, next) => {
    const key = clientKey(req);
    if (key === null) {
      console.error(`${req.method} ${req.url}: no client address (the connection is closed); refused`);
      return send(res, 400, { error: 'no client address' });
    }
    if (Buffer.byteLength(key) > 200) {          // pg_throttle's longest key name
      return send(res, 400, { error: 'X-Api-Key too long' });
    }
    let row;
    try {
      // SELECT ... FROM take(...): one call. (take(...)).* in a select list would take
      // one unit per output column.
      ({ rows: [row] } = await pool.query(
        'SELECT allowed, remaining, extract(epoch FROM retry_after) AS retry_after_s, ' +
        '       extract(epoch FROM reset_after) AS reset_after_s ' +
        'FROM throttle.take($1, $2, make_interval(secs => $3), $4)',
        [key, rate, per, burst]));
    } catch (err) {
      // Fail closed: without the database the limit cannot be checked.
      console.error(`rate limit check failed: ${err.message}`);
      return send(res, 503, { error: 'rate limit unavailable' }, { 'Retry-After': '1' });
    }
    // The epochs are numeric, returned as strings; headers take whole seconds, rounded UP
    // (0.4 s rounded to the nearest would tell the client to come back at once).
    res.setHeader('RateLimit-Limit', String(burst));
    res.setHeader('RateLimit-Remaining', String(row.remaining));
    res.setHeader('RateLimit-Reset', String(Math.ceil(Number(row.reset_after_s))));
    if (!row.allowed) {
      const retryAfter = Math.max(1, Math.ceil(Number(row.retry_after_s)));
      return send(res, 429, { error: 'rate limited', retry_after_s: Number(row.retry_after_s) },
                  { 'Retry-After': String(retryAfter) });
    }
    return next();
  };
}

function send(res, status, body, headers = {}) {
  res.writeHead(status, { 'Content-Type': 'application/json', ...headers });
  res.end(JSON.stringify(body) + '\n');
}

function main() {
  const shape = { rate: Number(opts.rate), per: Number(opts.per), burst: Number(opts.burst) };
  const pool = new Pool({ application_name: 'ratelimit_server', max: 10 });
  pool.on('error', (err) => console.error(`idle client error: ${err.message}`));
  const limit = rateLimit(pool, shape);

  const server = http.createServer((req, res) => {
    limit(req, res, () => send(res, 200, { ok: true, path: req.url }));
  });
  server.listen(Number(opts.port), '127.0.0.1', () => {
    console.log(`listening on http://127.0.0.1:${server.address().port}`);
  });

  const stop = () => {
    server.close(() => pool.end().then(() => process.exit(0)));
    server.closeAllConnections();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main();
