'use strict';
// Grants and denials per second of the registry, per kind: the counters of
// throttle.registry_metrics only grow (until a restart), so a rate is the
// difference between two samples over the time between them. The server keeps
// the previous sample with the server's start time (pg_postmaster_start_time()):
// a sample from another start is never compared with it (the counters began
// again from 0, and may have grown back past it). A sample taken less than
// `minSeconds` after the previous one does not replace it, and the last rates
// computed are shown meanwhile; a previous sample older than `maxSeconds` is
// dropped, with the rates (no rate over minutes, and none shown from then):
// rates show again once two fresh samples exist.
class RateTracker {
  constructor(minSeconds = 1, maxSeconds = 30) {
    this.minSeconds = minSeconds;
    this.maxSeconds = maxSeconds;
    this.previous = null; // { at: ms, started, counts: Map(kind -> {grants, denials}) }
    this.rates = new Map(); // kind -> {grants_per_second, denials_per_second, over_seconds}
  }

  // rows: [{kind, grants, denials}] with numbers; at: milliseconds (monotonic);
  // started: the server's start time (any value compared with ===).
  observe(rows, at, started = null) {
    const counts = new Map(rows.map((r) => [r.kind, { grants: r.grants, denials: r.denials }]));
    const previous = this.previous;
    if (previous === null || previous.started !== started || (at - previous.at) / 1000 > this.maxSeconds) {
      this.previous = { at, started, counts };
      this.rates = new Map();
      return this.rates;
    }
    const seconds = (at - previous.at) / 1000;
    if (seconds < this.minSeconds) return this.rates;
    const rates = new Map();
    for (const [kind, now] of counts) {
      const before = previous.counts.get(kind);
      // A counter that went down was reset by a restart: no rate from it.
      if (!before || now.grants < before.grants || now.denials < before.denials) continue;
      rates.set(kind, {
        grants_per_second: (now.grants - before.grants) / seconds,
        denials_per_second: (now.denials - before.denials) / seconds,
        over_seconds: seconds,
      });
    }
    this.rates = rates;
    this.previous = { at, started, counts };
    return rates;
  }
}

module.exports = { RateTracker };
