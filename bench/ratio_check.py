#!/usr/bin/python3
"""make bench's guard on the hot paths: flags each ratio to SELECT 1 that
dropped since the last run kept in bench/results/hot_paths.tsv (more than the
tolerance, 10 % by default: rounds on a shared 2-core machine vary by about
5 %), and each target the run misses; then keeps this run as the new baseline.

    ratio_check.py NEW.tsv BASELINE.tsv [TOLERANCE]

Both files: script, median tps, ratio to SELECT 1 (tab-separated, with a
header). Prints one line per flag and a last line "N ratios flagged".
"""
import os
import shutil
import sys

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


new_path, baseline_path = sys.argv[1], sys.argv[2]
tolerance = float(sys.argv[3]) if len(sys.argv) > 3 else 0.10
new = read(new_path)
flags = 0
if os.path.exists(baseline_path):
    old = read(baseline_path)
    for script, (_, ratio) in new.items():
        if script in old and ratio < old[script][1] * (1 - tolerance):
            flags += 1
            print(f"FLAG {script}: {old[script][1]:.2f} -> {ratio:.2f} x SELECT 1 "
                  f"(dropped more than {tolerance:.0%} since the last run)")
else:
    print(f"no baseline at {baseline_path}: this run becomes it")
for script, against, least in TARGETS:
    if script in new and against in new:
        ratio = new[script][0] / new[against][0]
        if ratio < least:
            flags += 1
            print(f"FLAG {script}: {ratio:.2f} x {against}, the target is {least:.2f}")
shutil.copyfile(new_path, baseline_path)
print(f"{flags} ratios flagged")
