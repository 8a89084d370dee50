#!/usr/bin/env node
'use strict';
// pg-throttle-dashboard [--database URL] [--host 127.0.0.1] [--port 8089] [--allow-host NAME]...
const { parseArgs } = require('node:util');
const { createDashboard, VersionError } = require('../lib/server');
const { isLoopback } = require('../lib/security');

const USAGE = `usage: pg-throttle-dashboard [--database URL] [--host HOST] [--port PORT] [--allow-host NAME]...

  --database URL     postgres://user@host:port/dbname (a socket directory as ?host=/path);
                     without it, the libpq environment (PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD)
  --host HOST        the address to listen on (default 127.0.0.1)
  --port PORT        the port (default 8089; 0: any free port). The first line printed is
                     "listening on http://HOST:PORT/"
  --allow-host NAME  another name the Host header may carry: NAME (any port, e.g. behind a
                     reverse proxy that passes the Host header on) or NAME:PORT; repeatable.
                     Other names are refused (DNS rebinding)

The page shows what the database role may read, and a button for each action the role may take.`;

function fail(message) {
  process.stderr.write(`pg-throttle-dashboard: ${message}\n`);
  process.exit(2);
}

async function main() {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        database: { type: 'string' },
        host: { type: 'string', default: '127.0.0.1' },
        port: { type: 'string', default: '8089' },
        'allow-host': { type: 'string', multiple: true, default: [] },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (e) {
    fail(`${e.message}\n${USAGE}`);
  }
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  if (!/^[0-9]{1,5}$/.test(values.port) || Number(values.port) > 65535) fail(`--port ${values.port}: not a port number`);
  let dashboard;
  try {
    dashboard = await createDashboard({
      connectionString: values.database,
      host: values.host,
      port: Number(values.port),
      allowHosts: values['allow-host'],
      log: (line) => process.stdout.write(`action ${line}\n`),
    });
  } catch (e) {
    if (e instanceof VersionError) fail(e.message);
    if (e.code === 'EADDRINUSE' || e.code === 'EACCES' || e.code === 'EADDRNOTAVAIL') fail(`cannot listen on ${values.host}:${values.port}: ${e.message}`);
    if (/allowed host/.test(e.message)) fail(e.message);
    process.stderr.write(`pg-throttle-dashboard: cannot connect to the database: ${e.message}\n`);
    process.exit(1);
  }
  process.stdout.write(`listening on ${dashboard.url}\n`);
  if (!isLoopback(values.host.toLowerCase())) {
    process.stderr.write(`pg-throttle-dashboard: WARNING: listening on ${values.host}, not a loopback address: ` +
      'the dashboard has no login, so anyone who can reach this port reads the database and takes the actions ' +
      'as its database role. Keep it on 127.0.0.1 and reach it through an SSH ' +
      'tunnel, or a reverse proxy with its own authentication (--allow-host).\n');
  }
  let stopping = false;
  const stop = () => {
    if (stopping) process.exit(0);
    stopping = true;
    // close() refuses the requests waiting for a connection and ends the
    // queries in flight; should anything still hang, exit anyway.
    setTimeout(() => process.exit(0), 3000).unref();
    dashboard.close().then(() => process.exit(0), () => process.exit(0));
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

main();
