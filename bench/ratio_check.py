#!/usr/bin/python3
"""make bench's guard on the hot paths: flags each ratio to SELECT 1 that is
more than the tolerance (10 % by default: rounds on a shared 2-core machine
vary by about 5 %) below its best of the last five runs, and each target the
run misses. The runs are kept in bench/results/hot_paths_history.tsv (date,
script, ratio), so that a ratio that slips a little at every run is flagged
too, and a flagged run does not become the measure of the next; the last
run's table is bench/results/hot_paths.tsv.

    ratio_check.py NEW.tsv RESULTS_DIR [TOLERANCE]

NEW.tsv: script, median tps, ratio to SELECT 1 (tab-separated, a header).
Prints one line per flag and a last line "N ratios flagged".
"""
import datetime
import os
import shutil
import sys

RUNS = 5
# (script, what it is measured against, the least ratio it must reach)
TARGETS = [
    ("acquire_hot_granted", "select1", 0.95),
    ("take_100k", "select1", 0.70),
    ("lock_unlock", "advisory_pair", 1.00),
]


def read(path):
    table = {}
    with open(path) as f:
        next(f)
        for line in f:
            script, tps, ratio = line.rstrip("\n").split("\t")
            table[script] = (float(tps), float(ratio))
    return table


new_path, results = sys.argv[1], sys.argv[2]
tolerance = float(sys.argv[3]) if len(sys.argv) > 3 else 0.10
os.makedirs(results, exist_ok=True)
history_path = os.path.join(results, "hot_paths_history.tsv")
new = read(new_path)
runs = []  # [(date, {script: ratio})], oldest first
if os.path.exists(history_path):
    with open(history_path) as f:
        for line in f:
            date, script, ratio = line.rstrip("\n").split("\t")
            if not runs or runs[-1][0] != date:
                runs.append((date, {}))
            runs[-1][1][script] = float(ratio)
flags = 0
recent = runs[-RUNS:]
for script, (_, ratio) in new.items():
    before = [r[script] for _, r in recent if script in r]
    if before and ratio < max(before) * (1 - tolerance):
        flags += 1
        print(f"FLAG {script}: {ratio:.2f} x SELECT 1, best of the last {len(before)} runs "
              f"{max(before):.2f} (more than {tolerance:.0%} below)")
if not recent:
    print(f"no earlier runs in {history_path}: this run starts it")
for script, against, least in TARGETS:
    if script in new and against in new:
        ratio = new[script][0] / new[against][0]
        if ratio < least:
            flags += 1
            print(f"FLAG {script}: {ratio:.2f} x {against}, the target is {least:.2f}")
date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")
with open(history_path, "a") as f:
    for script, (_, ratio) in new.items():
        f.write(f"{date}\t{script}\t{ratio:.3f}\n")
shutil.copyfile(new_path, os.path.join(results, "hot_paths.tsv"))
print(f"{flags} ratios flagged")
