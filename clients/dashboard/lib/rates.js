'use strict';
// Grants and denials per second of the registry, per kind: the counters of
// throttle.registry_metrics only grow (until a restart), so a rate is the
// difference between two samples over the time between them. The server keeps
// the previous sample; a sample taken less than `minSeconds` after it does not
// replace it, and the last rates computed are shown meanwhile.
class RateTracker {
  constructor(minSeconds = 1) {
    this.minSeconds = minSeconds;
    this.previous = null; // { at: ms, counts: Map(kind -> {grants, denials}) }
    this.rates = new Map(); // kind -> {grants_per_second, denials_per_second, over_seconds}
  }

  // rows: [{kind, grants, denials}] with numbers; at: milliseconds (monotonic).
  observe(rows, at) {
    const counts = new Map(rows.map((r) => [r.kind, { grants: r.grants, denials: r.denials }]));
    if (this.previous === null) {
      this.previous = { at, counts };
      return this.rates;
    }
    const seconds = (at - this.previous.at) / 1000;
    if (seconds < this.minSeconds) return this.rates;
    const rates = new Map();
    for (const [kind, now] of counts) {
      const before = this.previous.counts.get(kind);
      // A counter that went down was reset by a restart: no rate from it.
      if (!before || now.grants < before.grants || now.denials < before.denials) continue;
      rates.set(kind, {
        grants_per_second: (now.grants - before.grants) / seconds,
        denials_per_second: (now.denials - before.denials) / seconds,
        over_seconds: seconds,
      });
    }
    this.rates = rates;
    this.previous = { at, counts };
    return rates;
  }
}

module.exports = { RateTracker };
