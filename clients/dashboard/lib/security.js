'use strict';
// Cross-site protection. The dashboard has no login: whoever reaches its port
// acts as its database role, so it binds to 127.0.0.1 by default and refuses
// what a web page of another site could make a browser send:
// - a Host header other than the address it listens on (DNS rebinding: a
//   name the attacker controls resolving to 127.0.0.1);
// - on a read (GET /api/...): a foreign Origin, a cross-site or same-site
//   Sec-Fetch-Site, and a request without the header X-PGTD-Read (which the
//   page sends, and which a page of another origin can only send after a CORS
//   preflight the server never grants): each read is a database transaction,
//   and any web page could otherwise make the dashboard run them at will;
// - on an action: a foreign Origin or a cross-site Sec-Fetch-Site, a body
//   other than JSON (which HTML forms cannot send), and a missing or wrong
//   CSRF token: a random token per server start, set in a SameSite=Strict
//   cookie and echoed by the page in the X-CSRF-Token header (double submit).
const crypto = require('node:crypto');
const net = require('node:net');

const TOKEN_HEADER = 'x-csrf-token';
const READ_HEADER = 'x-pgtd-read';

function isLoopback(host) {
  return host === 'localhost' || host === '::1' || /^127\./.test(host);
}

function isWildcard(host) {
  return host === '0.0.0.0' || host === '::' || host === '';
}

function hostPort(host, port) {
  return `${net.isIPv6(host) ? `[${host}]` : host}:${port}`.toLowerCase();
}

// Splits a Host header into [host, port]; port null when it names none.
function parseHost(header) {
  if (typeof header !== 'string' || header.length === 0 || header.length > 300) return null;
  const m = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+)(?::([0-9]{1,5}))?$/.exec(header.trim());
  if (!m || (m[2] !== undefined && Number(m[2]) > 65535)) return null;
  const host = m[1].startsWith('[') ? m[1].slice(1, -1) : m[1];
  return [host.toLowerCase(), m[2] === undefined ? null : Number(m[2])];
}

class Guard {
  // host: the address listened on; port: the port bound; allowHosts: more
  // names the Host header may carry: "name" with any port or none (behind a
  // reverse proxy, https://name/), "name:port" with that port only.
  constructor({ host, port, allowHosts = [] }) {
    this.port = port;
    this.token = crypto.randomBytes(32).toString('base64url');
    this.cookieName = `pgtd_csrf_${port}`;
    this.wildcard = isWildcard(host);
    this.allowed = new Set([hostPort(host, port)]);
    this.anyPort = new Set();
    // Bound to a loopback address or to every address, the machine's own
    // loopback names reach it: no attacker controls what they resolve to.
    if (isLoopback(host) || this.wildcard) {
      for (const h of ['localhost', '127.0.0.1', '::1']) this.allowed.add(hostPort(h, port));
    }
    for (const h of allowHosts) {
      const parsed = parseHost(h);
      if (!parsed) throw new Error(`allowed host ${JSON.stringify(h)}: not a name, IP or [IPv6], with an optional :port`);
      if (parsed[1] === null) this.anyPort.add(parsed[0]);
      else this.allowed.add(hostPort(parsed[0], parsed[1]));
    }
  }

  // Whether the request's Host header names this server (a Host without a
  // port is port 80). Bound to every address (0.0.0.0), any IP literal with
  // the port is accepted too: DNS rebinding needs a name.
  hostAllowed(header) {
    const parsed = parseHost(header);
    if (!parsed) return false;
    const [host, named] = parsed;
    if (this.anyPort.has(host)) return true;
    const port = named === null ? 80 : named;
    if (this.allowed.has(hostPort(host, port))) return true;
    return this.wildcard && port === this.port && net.isIP(host) !== 0;
  }

  cookie() {
    return `${this.cookieName}=${this.token}; Path=/; SameSite=Strict`;
  }

  // null when a request's Origin and Sec-Fetch-Site are the page's own (or
  // absent: not a browser), else the reason to refuse it.
  siteRefusal(req) {
    const origin = req.headers.origin;
    // The page's own origin: its Host (checked already), over http, or over
    // https behind a reverse proxy that passes the Host on.
    if (origin !== undefined && origin !== `http://${req.headers.host}` && origin !== `https://${req.headers.host}`) {
      return `cross-site request refused: Origin ${JSON.stringify(String(origin).slice(0, 200))} is not this dashboard`;
    }
    const site = req.headers['sec-fetch-site'];
    if (site !== undefined && site !== 'same-origin' && site !== 'none') {
      return `cross-site request refused: Sec-Fetch-Site is ${JSON.stringify(String(site).slice(0, 50))}`;
    }
    return null;
  }

  // null when a read (GET /api/...) may go on, else the reason to refuse it (403).
  readRefusal(req) {
    const refusal = this.siteRefusal(req);
    if (refusal) return refusal;
    if (req.headers[READ_HEADER] === undefined) {
      return 'the dashboard\'s API is read with the header X-PGTD-Read: 1 (which another site\'s page cannot send)';
    }
    return null;
  }

  // null when an action request may go on, else the reason to refuse it (403).
  actionRefusal(req) {
    const refusal = this.siteRefusal(req);
    if (refusal) return refusal;
    const header = req.headers[TOKEN_HEADER];
    // Every cookie of the token's name: a page of another port of the same
    // host may have planted one (cookies do not keep ports apart), which the
    // browser may send first. One holding the token is enough: the planted
    // one cannot hold it, as only this server and its page know it.
    const cookies = readCookies(req.headers.cookie, this.cookieName);
    if (typeof header !== 'string' || cookies.length === 0) {
      return 'missing CSRF token: reload the dashboard\'s page (the X-CSRF-Token header must echo its cookie)';
    }
    if (!same(header, this.token) || !cookies.some((c) => same(c, this.token))) {
      return 'wrong CSRF token: reload the dashboard\'s page (the dashboard was restarted?)';
    }
    return null;
  }
}

function same(a, b) {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && crypto.timingSafeEqual(x, y);
}

// The values of every cookie called `name`, in the order the header gives them.
function readCookies(header, name) {
  const out = [];
  if (typeof header !== 'string') return out;
  for (const part of header.split(';')) {
    const i = part.indexOf('=');
    if (i > 0 && part.slice(0, i).trim() === name) out.push(part.slice(i + 1).trim());
  }
  return out;
}

function readCookie(header, name) {
  const all = readCookies(header, name);
  return all.length ? all[0] : null;
}

module.exports = { Guard, TOKEN_HEADER, READ_HEADER, parseHost, readCookie, readCookies, isLoopback, isWildcard };
