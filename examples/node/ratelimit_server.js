#!/usr/bin/env node
// An HTTP server with a pg_throttle rate limit in front of its handler, on the pg-throttle
// client (clients/node).
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
const { withRateLimit } = require('pg-throttle');

const { values: opts } = parseArgs({
  options: {
    port: { type: 'string', default: '8080' },
    rate: { type: 'string', default: '100' },
    per: { type: 'string', default: '60' },     // seconds
    burst: { type: 'string', default: '20' },
  },
});

function main() {
  const pool = new Pool({ application_name: 'ratelimit_server', max: 10 });
  pool.on('error', (err) => console.error(`idle client error: ${err.message}`));

  // A real server would check the API key before keying by it (the default key function
  // takes X-Api-Key as it comes): an unchecked key lets a client pick a fresh bucket for
  // every request.
  const server = http.createServer(withRateLimit(
    pool,
    { rate: Number(opts.rate), per: Number(opts.per), burst: Number(opts.burst), log: console.error },
    (req, res) => {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ ok: true, path: req.url }) + '\n');
    }));
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
