'use strict';
// The pieces that need no database: the Host and Origin rules, the CSRF
// cookie, and the rates from two samples.
const { test } = require('node:test');
const assert = require('node:assert/strict');

const { Guard, parseHost, readCookie, readCookies } = require('../lib/security');
const { RateTracker } = require('../lib/rates');

function req(headers) {
  return { headers };
}

test('Host: the bound address, its loopback names, --allow-host names; nothing else', () => {
  const g = new Guard({ host: '127.0.0.1', port: 8089, allowHosts: ['dash.internal', 'proxy.example:443', '[fd00::1]'] });
  for (const h of ['127.0.0.1:8089', 'localhost:8089', 'LocalHost:8089', '[::1]:8089', 'dash.internal:8089', 'dash.internal',
    'dash.internal:443', 'proxy.example:443', '[fd00::1]:8089', '[fd00::1]']) {
    assert.equal(g.hostAllowed(h), true, h);
  }
  for (const h of [undefined, '', '127.0.0.1', '127.0.0.1:8090', 'evil.example:8089', 'proxy.example', 'proxy.example:8089',
    '127.0.0.1.evil.example:8089', '127.0.0.1:8089:1', 'a'.repeat(400), '[::1:8089', '10.0.0.1:8089']) {
    assert.equal(g.hostAllowed(h), false, String(h));
  }
  assert.throws(() => new Guard({ host: '127.0.0.1', port: 1, allowHosts: ['a b'] }), /allowed host "a b"/);
});

test('Host on a wildcard address: IP literals and the loopback names with the port, no other name', () => {
  const g = new Guard({ host: '0.0.0.0', port: 9000 });
  for (const h of ['10.1.2.3:9000', '[fe80::1]:9000', '0.0.0.0:9000', 'localhost:9000', 'LOCALHOST:9000', '127.0.0.1:9000', '[::1]:9000']) {
    assert.equal(g.hostAllowed(h), true, h);
  }
  for (const h of ['10.1.2.3:9001', 'rebind.example:9000', 'localhost:9001', 'localhost', 'localhost.evil.example:9000']) {
    assert.equal(g.hostAllowed(h), false, h);
  }
  assert.equal(new Guard({ host: '::', port: 9000 }).hostAllowed('localhost:9000'), true);
  const other = new Guard({ host: '192.168.1.5', port: 9000 });
  assert.equal(other.hostAllowed('192.168.1.5:9000'), true);
  assert.equal(other.hostAllowed('localhost:9000'), false);
});

test('an action needs its own Origin (or none), a same-origin fetch, and the token in header and cookie', () => {
  const g = new Guard({ host: '127.0.0.1', port: 8089 });
  const ok = { host: '127.0.0.1:8089', origin: 'http://127.0.0.1:8089', 'sec-fetch-site': 'same-origin', 'x-csrf-token': g.token, cookie: `a=b; ${g.cookieName}=${g.token}` };
  assert.equal(g.actionRefusal(req(ok)), null);
  assert.equal(g.actionRefusal(req({ ...ok, origin: undefined, 'sec-fetch-site': undefined })), null);
  assert.match(g.actionRefusal(req({ ...ok, origin: 'http://localhost:8089' })), /Origin/);
  assert.equal(g.actionRefusal(req({ ...ok, origin: 'https://127.0.0.1:8089' })), null, 'https through a proxy');
  assert.match(g.actionRefusal(req({ ...ok, 'sec-fetch-site': 'same-site' })), /Sec-Fetch-Site/);
  assert.match(g.actionRefusal(req({ ...ok, 'x-csrf-token': undefined })), /missing CSRF token/);
  assert.match(g.actionRefusal(req({ ...ok, cookie: 'a=b' })), /missing CSRF token/);
  assert.match(g.actionRefusal(req({ ...ok, 'x-csrf-token': `${g.token}x` })), /wrong CSRF token/);
  assert.notEqual(new Guard({ host: '127.0.0.1', port: 8089 }).token, g.token, 'a token per start');
  assert.equal(g.cookie(), `pgtd_csrf_8089=${g.token}; Path=/; SameSite=Strict`);
  assert.equal(readCookie('x=1; pgtd_csrf_8089=abc; y=2', 'pgtd_csrf_8089'), 'abc');
  assert.deepEqual(parseHost('[::1]:80'), ['::1', 80]);
  assert.deepEqual(parseHost('Example.COM'), ['example.com', null]);
  assert.equal(parseHost('a:70000'), null);
});

test('rates: the counters\' difference over the time between two samples a second apart or more', () => {
  const t = new RateTracker(1);
  assert.equal(t.observe([{ kind: 'bucket', grants: 10, denials: 0 }], 0).size, 0);
  assert.equal(t.observe([{ kind: 'bucket', grants: 15, denials: 1 }], 500).size, 0, 'too soon: no rate yet');
  let r = t.observe([{ kind: 'bucket', grants: 30, denials: 4 }], 2000).get('bucket');
  assert.deepEqual(r, { grants_per_second: 10, denials_per_second: 2, over_seconds: 2 });
  r = t.observe([{ kind: 'bucket', grants: 31, denials: 4 }], 2500).get('bucket');
  assert.equal(r.grants_per_second, 10, 'the last rates until a second has passed');
  // A restart resets the counters: no rate from a counter that went down.
  assert.equal(t.observe([{ kind: 'bucket', grants: 2, denials: 0 }], 4000).size, 0);
  assert.equal(t.observe([{ kind: 'bucket', grants: 6, denials: 0 }], 6000).get('bucket').grants_per_second, 2);
});

test('a second cookie of the token\'s name (planted by another port\'s page) does not lock the page out', () => {
  const g = new Guard({ host: '127.0.0.1', port: 8089 });
  const ok = { host: '127.0.0.1:8089', origin: 'http://127.0.0.1:8089', 'sec-fetch-site': 'same-origin', 'x-csrf-token': g.token };
  // The browser sends the cookie of the longer Path first.
  assert.equal(g.actionRefusal(req({ ...ok, cookie: `${g.cookieName}=planted; ${g.cookieName}=${g.token}` })), null);
  assert.equal(g.actionRefusal(req({ ...ok, cookie: `${g.cookieName}=${g.token}; ${g.cookieName}=planted` })), null);
  // Planted cookies alone, or the header not the token: refused.
  assert.match(g.actionRefusal(req({ ...ok, cookie: `${g.cookieName}=planted; ${g.cookieName}=other` })), /wrong CSRF token/);
  assert.match(g.actionRefusal(req({ ...ok, 'x-csrf-token': 'planted', cookie: `${g.cookieName}=planted; ${g.cookieName}=${g.token}` })),
    /wrong CSRF token/);
  assert.deepEqual(readCookies('a=1; x=2; a=3', 'a'), ['1', '3']);
});

test('a read (GET /api/...) needs the page\'s X-PGTD-Read header and its own Origin and Sec-Fetch-Site', () => {
  const g = new Guard({ host: '127.0.0.1', port: 8089 });
  const ok = { host: '127.0.0.1:8089', 'sec-fetch-site': 'same-origin', 'x-pgtd-read': '1' };
  assert.equal(g.readRefusal(req(ok)), null);
  assert.equal(g.readRefusal(req({ host: ok.host, 'x-pgtd-read': '1' })), null, 'not a browser (curl -H ...)');
  assert.equal(g.readRefusal(req({ ...ok, 'sec-fetch-site': 'none' })), null, 'typed in the address bar');
  assert.match(g.readRefusal(req({ ...ok, 'x-pgtd-read': undefined })), /X-PGTD-Read/);
  for (const site of ['same-site', 'cross-site']) {
    assert.match(g.readRefusal(req({ ...ok, 'sec-fetch-site': site })), /Sec-Fetch-Site/, site);
  }
  assert.match(g.readRefusal(req({ ...ok, origin: 'http://127.0.0.1:8090' })), /Origin/);
  assert.equal(g.readRefusal(req({ ...ok, origin: 'http://127.0.0.1:8089' })), null);
});

test('rates: a sample of another server start, or older than 30 s, is never compared with', () => {
  const t = new RateTracker(1, 30);
  assert.equal(t.observe([{ kind: 'bucket', grants: 100, denials: 10 }], 0, 'start-1').size, 0);
  assert.equal(t.observe([{ kind: 'bucket', grants: 110, denials: 10 }], 2000, 'start-1').get('bucket').grants_per_second, 5);
  // The server restarted and its counters grew back past the last sample: no rate.
  assert.equal(t.observe([{ kind: 'bucket', grants: 150, denials: 12 }], 4000, 'start-2').size, 0);
  assert.equal(t.observe([{ kind: 'bucket', grants: 154, denials: 12 }], 6000, 'start-2').get('bucket').grants_per_second, 2);
  // Nobody looked for a minute: the old sample is dropped, rates show again after two fresh ones.
  assert.equal(t.observe([{ kind: 'bucket', grants: 754, denials: 12 }], 66000, 'start-2').size, 0);
  assert.equal(t.observe([{ kind: 'bucket', grants: 764, denials: 12 }], 71000, 'start-2').get('bucket').grants_per_second, 2);
});
