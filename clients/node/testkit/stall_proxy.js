'use strict';
// A Unix-socket proxy in front of the test server whose traffic can be held
// (a stalled network: queries sent, no answer, no error), then cut. stall() holds every
// connection's traffic; stall({ connection: i }) only that of the i-th one made through it.
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');

async function stallProxy() {
  const port = Number(process.env.PGPORT || 5432);
  const host = process.env.PGHOST || '/var/run/postgresql';
  // The server's Unix socket, or its TCP address (pg_virtualenv's PGHOST=localhost).
  const target = host.startsWith('/') ? { path: path.join(host, `.s.PGSQL.${port}`) } : { host, port };
  const dir = fs.mkdtempSync('/tmp/pgtp.');
  const socks = [];
  let stalled = false;
  let count = 0;
  const stalledOnes = new Set();
  const held = [];
  const server = net.createServer((c) => {
    const s = net.connect(target);
    const index = count++;
    socks.push(c, s);
    const fwd = (from, to) => from.on('data', (d) => {
      if (stalled || stalledOnes.has(index)) held.push([to, d]); else to.write(d);
    });
    fwd(c, s);
    fwd(s, c);
    c.on('error', () => {}); s.on('error', () => {});
    c.on('close', () => s.destroy()); s.on('close', () => c.destroy());
  });
  await new Promise((r) => server.listen(path.join(dir, `.s.PGSQL.${port}`), r));
  return {
    connection: { host: dir, port },
    stall({ connection } = {}) { if (connection === undefined) stalled = true; else stalledOnes.add(connection); },
    cut() { for (const x of socks) x.destroy(); },
    async close() { this.cut(); await new Promise((r) => server.close(r)); fs.rmSync(dir, { recursive: true, force: true }); },
  };
}

module.exports = { stallProxy };
