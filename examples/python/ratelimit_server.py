#!/usr/bin/python3
"""An HTTP server with a pg_throttle rate limit in front of every request.

    ratelimit_server.py [--dsn DSN] [--port 0] [--rate 2] [--per 1] [--burst 3]

The limit is pg_throttle.RateLimiter of the Python client (clients/python;
for an ASGI application, pg_throttle.RateLimitMiddleware does the same). Each
request is keyed by its client: the X-Api-Key header, else the client's
address (behind a proxy, use the address the proxy forwards instead); a key
that makes the bucket's name longer than pg_throttle's 200 bytes gets 400. One
throttle.take per request takes a unit from the client's bucket, `rate` units
per `per` seconds with bursts of `burst` (GCRA, in the server's shared memory:
every process and host that uses the same database shares the limit).

Allowed: 200 and the application's answer. Denied: 429 with Retry-After, the
whole seconds until the same request would pass, rounded UP (rounded to the
nearest, 0.4 s would say "come back now" and the client would be refused
again); its body gives retry_after exactly, in seconds. Every answer carries
the IETF draft's RateLimit-Limit (the burst), RateLimit-Remaining and
RateLimit-Reset (seconds until the bucket is full).

Connections come from a psycopg_pool pool (Debian: python3-psycopg-pool), in
autocommit: a take is one statement, and holding a transaction open across
requests would pin a connection for nothing. When the database cannot
answer (or no pooled connection comes in time) the answer is 503, failing
closed rather than letting requests through. Listens on 127.0.0.1; port 0
picks a free port, printed on the first line of output.
"""
import argparse
import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from psycopg_pool import ConnectionPool

try:
    import pg_throttle
except ImportError:             # not installed: the client next to this example
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "clients", "python", "src"))
    import pg_throttle


def app(request):
    """The application behind the limit: answers who asked for what."""
    return {"path": request.path, "client": request.client_key()}


class Handler(BaseHTTPRequestHandler):
    limit = None                    # a pg_throttle.RateLimiter, set by main()
    protocol_version = "HTTP/1.1"   # keep-alive: a client may send many requests on one connection

    def client_key(self):
        api_key = self.headers.get("X-Api-Key")
        return f"key:{api_key}" if api_key else f"addr:{self.client_address[0]}"

    def do_GET(self):
        try:
            decision = self.limit.take(self.client_key())
        except pg_throttle.KeyTooLong:
            # The client's mistake, not the database's: take refuses a name over
            # 200 bytes (SQLSTATE 22023), so an over-long X-Api-Key is a 400.
            self.answer(400, {"error": "X-Api-Key too long"}, {})
            return
        except psycopg.OperationalError as e:
            # The database is away or the pool timed out (PoolTimeout is an
            # OperationalError). Fail closed: without the database there is
            # no limit to enforce.
            self.log_error("rate limit unavailable: %s", e)
            self.answer(503, {"error": "rate limit unavailable"}, {"Retry-After": "1"})
            return
        except psycopg.Error as e:
            # Any other refusal is a bug here, not an outage: no Retry-After.
            self.log_error("rate limit check failed: %s", e)
            self.answer(500, {"error": "rate limit check failed"}, {})
            return
        if decision.allowed:
            self.answer(200, app(self), decision.headers)
        else:
            self.answer(429, {"error": "too many requests",
                              "retry_after_s": decision.retry_after.total_seconds()}, decision.headers)

    do_POST = do_GET

    def answer(self, status, body, headers):
        data = (json.dumps(body) + "\n").encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="", help="connection string (default: the libpq environment)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: pick a free one)")
    parser.add_argument("--rate", type=int, default=2, help="units per --per")
    parser.add_argument("--per", type=float, default=1, help="seconds")
    parser.add_argument("--burst", type=int, default=None, help="bucket size (default: --rate)")
    parser.add_argument("--pool", type=int, default=4, help="most database connections")
    args = parser.parse_args()

    pool = ConnectionPool(args.dsn, min_size=1, max_size=args.pool, kwargs={"autocommit": True})
    pool.wait(timeout=10)           # fail at start, not on the first request, if the database is away
    with pool.connection() as conn:  # ... or has no pg_throttle this client supports (VersionError)
        pg_throttle.check_version(conn)
    Handler.limit = pg_throttle.RateLimiter(pool, args.rate, args.per, args.burst or args.rate, prefix="http:")
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    # SIGTERM ends serve_forever like Ctrl-C, so that the pool is closed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"listening on http://127.0.0.1:{server.server_address[1]}/", flush=True)
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
        pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
