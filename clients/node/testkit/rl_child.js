'use strict';
// A plain http server on withRateLimit for test/ratelimit.test.js: its key function throws for
// a request with X-Boom and returns a number (a numeric user id, 42) for one with X-Num; logs
// to stderr; sends its port.
const http = require('node:http');
const { Pool } = require('pg');
const { withRateLimit } = require('..');

const pool = new Pool({ max: 2 });
const key = (req) => {
  if (req.headers['x-boom']) throw new Error('no user on this request');
  if (req.headers['x-num']) return 42;
  return `nr:${process.pid}:${req.headers['x-k'] || 'k'}`;
};
const server = http.createServer(withRateLimit(pool, { rate: 100, per: 1, key, log: (m) => console.error(m) },
                                               (req, res) => res.end('ok')));
server.listen(0, '127.0.0.1', () => process.send({ port: server.address().port }));
