#!/usr/bin/python3
"""The report of a sustained run (bench/sustained.sh): its samples as Markdown
tables, the goal check and a plot (OUT_DIR/sustained.png).

    /usr/bin/python3 bench/sustained_report.py OUT_DIR

OUT_DIR holds meta.json and one CSV per contender, as
bench/queue-node/sustained.mjs writes them. The goal, for each contender:
outside the snapshot's window, the claims' p99 wait and each table's size
(heap and indexes) stay within 2 x their figure in the reference sample
(minute 5 of 30), and are back within that limit by the end of the recovery
time after the snapshot closes (5 minutes of 30), and stay there. A table
under 1 MB passes whatever its reference (2 x a few pages is noise). Exits 0
whatever the verdict: the verdict is printed.
"""
import csv
import json
import os
import sys

MB = 1048576
SMALL = 1 * MB


def load(out):
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    for run in meta["runs"]:
        with open(os.path.join(out, run["csv"])) as f:
            run["rows"] = [{k: (v if k == "contender" else float(v)) for k, v in r.items()}
                           for r in csv.DictReader(f)]
        run["short"] = [t.split(".")[1] for t in run["tables"]]
    return meta


def window(meta, run):
    opened = run["window"].get("opened")
    closed = run["window"].get("closed")
    return (meta["snapshot_open_s"] if opened is None else opened,
            meta["snapshot_close_s"] if closed is None else closed)


def size(row, table):
    return row[f"{table}_heap_bytes"] + row[f"{table}_index_bytes"]


def figures(run):
    """(name, value of a row, is a size) for every figure the goal judges."""
    out = [("claim wait p99 (ms)", lambda r: r["p99_ms"], False)]
    for t in run["short"]:
        out.append((f"{t}: heap + indexes (MB)", lambda r, t=t: size(r, t), True))
    return out


def minutes(seconds):
    """600 -> "10", 130 -> "2.17"."""
    return f"{seconds / 60:.2f}".rstrip("0").rstrip(".")


def fmt(value, is_size):
    if value is None:
        return "–"
    return f"{value / MB:.1f}" if is_size else f"{value:.1f}"


def goal(meta, run):
    """Prints the goal check of one run; returns True when every figure passes."""
    rows = run["rows"]
    step = meta["sample_seconds"]
    opened, closed = window(meta, run)
    deadline = closed + meta["recovery_s"]
    ref = min(rows, key=lambda r: abs(r["t_end_s"] - meta["reference_s"]))
    before = [r for r in rows if ref["t_end_s"] <= r["t_end_s"] <= opened]
    during = [r for r in rows if r["t_end_s"] > opened and r["t_end_s"] - step < closed]
    after = [r for r in rows if r["t_end_s"] >= deadline - 0.5]
    later = [r for r in rows if r["t_end_s"] > closed]
    print(f"\n**Goal check, {run['label']}**: reference = the sample ending at "
          f"{minutes(ref['t_end_s'])} min; snapshot open {minutes(opened)} – {minutes(closed)} min; "
          f"judged: the samples from the reference to the snapshot and those ending "
          f"{minutes(meta['recovery_s'])} min or more after it closed.\n")
    print("| figure | reference | limit (2 ×) | worst before the snapshot | worst with it open "
          "| back under the limit (min after close) | worst from close + "
          f"{minutes(meta['recovery_s'])} min | verdict |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    passed = True
    for name, value, is_size in figures(run):
        reference = value(ref)
        limit = max(2 * reference, SMALL) if is_size else 2 * reference
        worst = lambda rs: max((value(r) for r in rs), default=None)  # noqa: E731
        back = None
        for i, r in enumerate(later):
            if all(value(x) <= limit for x in later[i:]):
                back = r["t_end_s"] - closed
                break
        ok = all(value(r) <= limit for r in before + after) and bool(after)
        passed = passed and ok
        print(f"| {name} | {fmt(reference, is_size)} | {fmt(limit, is_size)} | "
              f"{fmt(worst(before), is_size)} | {fmt(worst(during), is_size)} | "
              f"{'not back' if back is None else minutes(back)} | {fmt(worst(after), is_size)} | "
              f"{'PASS' if ok else 'FAIL'} |")
    if not after:
        print(f"\nNo sample ends {minutes(meta['recovery_s'])} min after the snapshot closed: "
              "the run is too short to judge the recovery.")
    print(f"\n{run['label']}: goal {'met' if passed else 'missed'}.")
    return passed


def samples_table(meta, run):
    print(f"\n**{run['label']}**, every {meta['sample_seconds']:g} s "
          "(sizes in MB, heap / indexes; dead = n_dead_tup):\n")
    head = ["min", "snapshot", "jobs/s", "wait p50 (ms)", "wait p99 (ms)", "backlog"]
    for t in run["short"]:
        head += [f"{t} MB", f"{t} dead"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" + "---:|" * (len(head) - 1))
    for r in run["rows"]:
        cells = [minutes(r["t_end_s"]), "open" if r["snapshot_open"] else "",
                 f"{r['completed'] / meta['sample_seconds']:.0f}", f"{r['p50_ms']:.1f}",
                 f"{r['p99_ms']:.1f}", f"{r['backlog']:.0f}"]
        for t in run["short"]:
            cells += [f"{r[f'{t}_heap_bytes'] / MB:.1f} / {r[f'{t}_index_bytes'] / MB:.1f}",
                      f"{r[f'{t}_dead_tup']:.0f}"]
        print("| " + " | ".join(cells) + " |")


def plot(meta, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = meta["runs"]
    fig, axes = plt.subplots(4, len(runs), figsize=(7 * len(runs), 13), sharex=True,
                             sharey="row", squeeze=False)
    for col, run in enumerate(runs):
        rows = run["rows"]
        x = [r["t_end_s"] / 60 for r in rows]
        opened, closed = window(meta, run)
        lat, sizes, dead, load = axes[:, col]
        lat.plot(x, [max(r["p50_ms"], 0.01) for r in rows], marker=".", label="p50")
        lat.plot(x, [max(r["p99_ms"], 0.01) for r in rows], marker=".", label="p99")
        lat.plot(x, [max(r["max_ms"], 0.01) for r in rows], linestyle=":", label="max")
        lat.set_yscale("log")
        lat.set_ylabel("claim wait, ms (claimed_at − run_at)")
        lat.set_title(run["label"], fontsize=10)
        for i, t in enumerate(run["short"]):
            colour = f"C{i}"
            sizes.plot(x, [r[f"{t}_heap_bytes"] / MB for r in rows], color=colour, label=f"{t} heap")
            sizes.plot(x, [r[f"{t}_index_bytes"] / MB for r in rows], color=colour, linestyle="--",
                       label=f"{t} indexes")
            dead.plot(x, [r[f"{t}_dead_tup"] for r in rows], color=colour, label=t)
        sizes.set_ylabel("MB")
        dead.set_ylabel("dead tuples (n_dead_tup)")
        load.plot(x, [r["completed"] / meta["sample_seconds"] for r in rows], label="completed/s")
        load.plot(x, [r["enqueued"] / meta["sample_seconds"] for r in rows], linestyle="--",
                  label="enqueued/s")
        load.set_ylabel("events/s")
        # The backlog on an axis of its own: it can grow past the rates by orders of magnitude.
        backlog = load.twinx()
        backlog.plot(x, [r["backlog"] for r in rows], color="C2", linestyle=":",
                     label="backlog (pending)")
        backlog.set_ylabel("backlog (pending events)")
        backlog.legend(fontsize=7, loc="upper right")
        load.set_xlabel("minutes")
        for ax in axes[:, col]:
            ax.axvspan(opened / 60, closed / 60, color="grey", alpha=0.2,
                       label="old snapshot open" if ax is lat else None)
            ax.axvline((closed + meta["recovery_s"]) / 60, color="grey", linestyle=":")
            ax.axvline(meta["reference_s"] / 60, color="grey", linestyle="-.", linewidth=0.8)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
    # Two lines: one would run past the figure's width.
    fig.suptitle(f"pg_throttle sustained run: {meta['rate']:g} events/s, {meta['workers']} workers, "
                 f"{meta['minutes']:g} min, autovacuum defaults\n(grey: the old snapshot; "
                 f"dash-dot: the reference sample; dotted: recovery deadline)", fontsize=10)
    fig.tight_layout()
    path = os.path.join(out, "sustained.png")
    fig.savefig(path, dpi=90)
    return path


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    meta = load(out)
    if meta["maximum"] is None:
        how = "BENCH_SUSTAINED_RATE"
    elif meta["calibrate_seconds"] is None:
        how = f"70 % of BENCH_SUSTAINED_MAXIMUM, {meta['maximum']:.0f} events/s"
    else:
        how = (f"70 % of the {meta['maximum']:.0f} events/s measured first "
               f"({meta['calibrate_seconds']:g} s of schedule + claim + complete)")
    print(f"Sustained run: {meta['minutes']:g} min of {meta['rate']:g} events/s ({how}), "
          f"{meta['workers']} workers, {meta['job_ms']:g} ms per job, history purged past "
          f"{meta['keep_seconds']:g} s, autovacuum at its defaults; PostgreSQL {meta['server']}, "
          f"Node {meta['node']}; {os.cpu_count()} cores.")
    for run in meta["runs"]:
        samples_table(meta, run)
    verdicts = [goal(meta, run) for run in meta["runs"]]
    try:
        print(f"\nPlot: {plot(meta, out)}")
    except ImportError as e:
        print(f"\nNo plot: {e} (install python3-matplotlib)")
    print(f"CSV: {', '.join(os.path.join(out, r['csv']) for r in meta['runs'])}")
    print(f"\nGoal (pg_throttle): {'met' if verdicts[0] else 'missed'}.")


if __name__ == "__main__":
    main()
