"""pg_throttle's Python client (psycopg 3): a queue worker runtime, producers'
helpers, a renewed lease on a lock, and rate limits (with a pure-ASGI
middleware). Every entry point checks, on its first connection, that the
database's pg_throttle extension is a version this client supports
(VersionError otherwise)."""
from .asgi import RateLimitMiddleware, default_key
from .lease import Lease, LeaseLost, LockBusy, lease
from .queue import cancel, reschedule, schedule, schedule_many
from .ratelimit import AsyncRateLimiter, Decision, KeyTooLong, RateLimiter, whole_seconds_up
from .version import SUPPORTED, VersionError, __version__, check_version, check_version_async
from .worker import Cancelled, Context, RetryLater, Worker

__all__ = [
    "AsyncRateLimiter", "Cancelled", "Context", "Decision", "KeyTooLong", "Lease", "LeaseLost", "LockBusy",
    "RateLimitMiddleware", "RateLimiter", "RetryLater", "SUPPORTED", "VersionError", "Worker", "__version__",
    "cancel", "check_version", "check_version_async", "default_key", "lease", "reschedule", "schedule",
    "schedule_many", "whole_seconds_up",
]
