'use strict';
// The dashboard's HTTP server: node:http only. GET requests read (in read-only
// transactions); actions are POST /api/actions/<name> with a JSON body, behind
// the checks of ./security.js. Every answer of /api/ is JSON.
const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const path = require('node:path');
const { performance } = require('node:perf_hooks');
const pg = require('pg');

const { SUPPORTED, VersionError, checkVersion } = require('./version');
const { SECTIONS, read, isSqlError } = require('./queries');
const { runAction } = require('./actions');
const { Guard } = require('./security');
const { RateTracker } = require('./rates');
const { Connections, ShuttingDown } = require('./connections');

const BODY_LIMIT = 16 * 1024;
const PUBLIC_DIR = path.join(__dirname, '..', 'public');
const STATIC = {
  '/app.js': ['app.js', 'text/javascript; charset=utf-8'],
  '/style.css': ['style.css', 'text/css; charset=utf-8'],
  '/': ['index.html', 'text/html; charset=utf-8'],
  '/index.html': ['index.html', 'text/html; charset=utf-8'],
};
const SECURITY_HEADERS = {
  'Content-Security-Policy': "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  'X-Content-Type-Options': 'nosniff',
  'X-Frame-Options': 'DENY',
  'Referrer-Policy': 'no-referrer',
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Resource-Policy': 'same-origin',
  'Cache-Control': 'no-store',
};

class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function loadStatic() {
  const files = {};
  for (const [route, [file, type]] of Object.entries(STATIC)) {
    files[route] = { body: fs.readFileSync(path.join(PUBLIC_DIR, file)), type };
  }
  return files;
}

function send(res, status, body, type, extra = {}) {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  res.writeHead(status, { ...SECURITY_HEADERS, 'Content-Type': type, 'Content-Length': Buffer.byteLength(body), ...extra });
  res.end(body);
}

function sendJson(res, status, value, extra) {
  send(res, status, JSON.stringify(value), 'application/json; charset=utf-8', extra);
}

function readBody(req, limit) {
  return new Promise((resolve, reject) => {
    const declared = req.headers['content-length'];
    if (declared !== undefined && Number(declared) > limit) {
      reject(new HttpError(413, `the body is larger than ${limit} bytes`));
      return;
    }
    const chunks = [];
    let size = 0;
    let done = false;
    req.on('data', (chunk) => {
      if (done) return;
      size += chunk.length;
      if (size > limit) {
        done = true;
        reject(new HttpError(413, `the body is larger than ${limit} bytes`));
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => {
      if (!done) {
        done = true;
        resolve(Buffer.concat(chunks).toString('utf8'));
      }
    });
    req.on('error', (e) => {
      if (!done) {
        done = true;
        reject(e);
      }
    });
  });
}

// A lost or refused connection, as node-postgres and the socket report it.
function isConnectionError(e) {
  const code = typeof e.code === 'string' ? e.code : '';
  return /^(E[A-Z]+|08[0-9A-Z]{3}|57P0[1-3])$/.test(code) ||
    /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error/i.test(String(e.message));
}

function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new HttpError(400, `the body is not JSON: ${e.message}`);
  }
}

// The options: connectionString (a postgres:// URL; none: the libpq
// environment, PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD; connection:
// more node-postgres settings, e.g. {database}), host (default
// 127.0.0.1), port (default 8089; 0: any free port), allowHosts (more names
// the Host header may carry, e.g. behind a proxy), supported (the extension
// versions accepted), log (a function given one line per action, and per
// action refused as cross-site).
async function createDashboard(options = {}) {
  const host = options.host === undefined ? '127.0.0.1' : options.host;
  const port = options.port === undefined ? 8089 : options.port;
  const log = options.log || (() => {});
  const files = loadStatic();
  // Checks the allowed hosts before anything starts (throws on a bad one).
  new Guard({ host, port: port || 1, allowHosts: options.allowHosts || [] }); // eslint-disable-line no-new
  const pool = new pg.Pool({
    ...(options.connection || {}),
    connectionString: options.connectionString || undefined,
    max: options.poolSize || 4,
    application_name: 'pg-throttle-dashboard',
    statement_timeout: 15000,
    connectionTimeoutMillis: 10000,
    idleTimeoutMillis: 30000,
  });
  // An idle client whose connection dropped: the pool replaces it.
  pool.on('error', () => {});
  try {
    await checkVersion(pool, options.supported || SUPPORTED);
  } catch (e) {
    await pool.end().catch(() => {});
    throw e;
  }
  const connections = new Connections(pool);
  const state = { rates: new RateTracker(1), clock: () => performance.now() };
  // A first sample of the registry's counters, so that the first page shows rates.
  await read(connections, ['registry'], state).catch(() => {});

  let guard = null;
  const server = http.createServer((req, res) => {
    handle(req, res).catch((e) => {
      let status;
      let message;
      if (e instanceof HttpError) {
        [status, message] = [e.status, e.message];
      } else if (e instanceof ShuttingDown || closing) {
        [status, message] = [503, 'the dashboard is shutting down'];
      } else if (isSqlError(e)) {
        [status, message] = [500, e.message];
      } else if (isConnectionError(e)) {
        [status, message] = [503, `the database cannot be reached: ${e.message}`];
      } else {
        process.stderr.write(`pg-throttle-dashboard: ${e.stack || e}\n`);
        [status, message] = [500, 'internal error (the dashboard\'s log says more)'];
      }
      sendJson(res, status, { ok: false, error: message }, status === 413 ? { Connection: 'close' } : {});
    });
  });
  server.on('clientError', (err, socket) => {
    if (socket.writable) socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
    else socket.destroy();
  });

  async function handle(req, res) {
    if (guard === null) throw new HttpError(503, 'starting');
    if (!guard.hostAllowed(req.headers.host)) {
      throw new HttpError(403, `Host ${JSON.stringify(String(req.headers.host || '').slice(0, 200))} refused: ` +
        `open the dashboard at ${url} (a Host naming another server is how DNS rebinding reaches 127.0.0.1)`);
    }
    let pathname;
    try {
      pathname = new URL(req.url, 'http://localhost').pathname;
    } catch {
      throw new HttpError(400, 'the request\'s path is not a URL path');
    }
    if (pathname.startsWith('/api/actions/')) {
      if (req.method !== 'POST') {
        sendJson(res, 405, { ok: false, error: 'actions are POST requests' }, { Allow: 'POST' });
        return;
      }
      await action(req, res, pathname.slice('/api/actions/'.length));
      return;
    }
    // Anything but GET and HEAD, among them the CORS preflight (OPTIONS) of a
    // page of another origin: 405, with no CORS header.
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      sendJson(res, 405, { ok: false, error: `${req.method} is not allowed here` }, { Allow: 'GET, HEAD' });
      return;
    }
    if (pathname.startsWith('/api/')) {
      // Every read is a database transaction: a page of another site must not
      // make the dashboard run them (it could not read the answers, but could
      // load the database and take the pool's connections).
      const refusal = guard.readRefusal(req);
      if (refusal) throw new HttpError(403, refusal);
    }
    if (Object.prototype.hasOwnProperty.call(files, pathname)) {
      const file = files[pathname];
      const extra = file.type.startsWith('text/html') ? { 'Set-Cookie': guard.cookie() } : {};
      send(res, 200, file.body, file.type, extra);
      return;
    }
    if (pathname === '/api/overview') {
      // The name of the cookie holding the token (not the token): the page
      // may be behind a proxy on another port.
      sendJson(res, 200, { csrf_cookie: guard.cookieName, ...(await read(connections, Object.keys(SECTIONS), state)) });
      return;
    }
    if (pathname === '/api/permissions') {
      sendJson(res, 200, (await read(connections, [], state)).permissions);
      return;
    }
    const section = pathname.startsWith('/api/') ? pathname.slice(5) : null;
    if (section && Object.prototype.hasOwnProperty.call(SECTIONS, section)) {
      const out = await read(connections, [section], state);
      sendJson(res, out[section].error ? (out[section].error.code === '42501' ? 403 : 500) : 200, out[section]);
      return;
    }
    if (pathname.startsWith('/api/')) {
      sendJson(res, 404, { ok: false, error: `no endpoint ${pathname}` });
      return;
    }
    send(res, 404, 'Not found\n', 'text/plain; charset=utf-8');
  }

  async function action(req, res, name) {
    const refusal = guard.actionRefusal(req);
    if (refusal) {
      log(`403 ${name} refused: ${refusal}`);
      throw new HttpError(403, refusal);
    }
    const type = String(req.headers['content-type'] || '');
    if (!/^application\/json\s*(;|$)/i.test(type)) throw new HttpError(415, 'the body must be JSON (Content-Type: application/json)');
    const body = parseJson(await readBody(req, BODY_LIMIT));
    const result = await runAction(connections, name, body);
    log(`${result.status} ${name} ${JSON.stringify(body).slice(0, 300)}`);
    sendJson(res, result.status, result.body);
  }

  let closing = null;
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.removeListener('error', reject);
      resolve();
    });
  }).catch(async (e) => {
    await pool.end().catch(() => {});
    throw e;
  });
  const bound = server.address().port;
  guard = new Guard({ host, port: bound, allowHosts: options.allowHosts || [] });
  const url = `http://${net.isIPv6(host) ? `[${host}]` : host}:${bound}/`;

  return {
    server, pool, guard, url, port: bound,
    // Stops at once: requests waiting for a connection are refused, queries in
    // flight end with their connections, open HTTP connections are closed.
    close() {
      if (!closing) {
        closing = (async () => {
          const stopped = new Promise((resolve) => {
            server.close(() => resolve());
          });
          await connections.close();
          if (server.closeAllConnections) server.closeAllConnections();
          await stopped;
          await connections.close();
        })();
      }
      return closing;
    },
  };
}

module.exports = { createDashboard, VersionError, SUPPORTED, BODY_LIMIT };
