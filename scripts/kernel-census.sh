#!/bin/bash
# Where a decode step's GPU time goes, kernel by kernel (a diagnostic, not a
# benchmark): Nsight Compute times every kernel of `bench-model MODEL --pp 0
# --tg TOKENS` alone (gpu__time_duration, one pass a kernel), and the table
# sums the last quarter of the kernels after the load-time repacks
# (k_pad_blocks): about the last token's steps.  The profiler serializes the
# kernels and holds its own clocks, so small kernels read longer than they
# run inside a graph with programmatic dependent launch; compare shares, not
# sums, with tg128.
# Usage: scripts/kernel-census.sh BUILD MODEL [TOKENS]      (TOKENS: 3)
#        scripts/kernel-census.sh --table NCU.csv            (the table alone)
# Environment: NCU (default: ncu on PATH, else /usr/local/cuda/bin/ncu),
# COUNT (kernels profiled at most, 2500), OUT (where the CSV goes, a temp dir).
set -euo pipefail

table() {
    python3 - "$1" <<'EOF'
import collections, csv, sys

lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().split("\n")
start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
if start is None:
    sys.exit("kernel-census: no ncu CSV header in " + sys.argv[1])
rows = list(csv.reader(lines[start:]))
head = rows[0]
try:
    ki, ui, vi = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
except ValueError:
    sys.exit("kernel-census: the CSV has no Kernel Name / Metric Unit / Metric Value columns")
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
kernels = []
for r in rows[1:]:
    if len(r) <= max(ki, ui, vi) or r[ui] not in scale:
        continue
    name = r[ki].split("(")[0].strip()
    if name.startswith("void "):
        name = name[5:]
    kernels.append((name, float(r[vi].replace(",", "")) * scale[r[ui]]))
step = [k for k in kernels if not k[0].startswith("k_pad_blocks")]
if not step:
    sys.exit("kernel-census: no kernels past the load-time repacks")
last = step[-max(1, len(step) // 4):]
count, total = collections.Counter(), collections.Counter()
for name, us in last:
    count[name] += 1
    total[name] += us
whole = sum(total.values())
print("%d kernels profiled, %d after the repacks; the last %d: %.1f us" % (len(kernels), len(step), len(last), whole))
print("%-44s %6s %10s %7s %9s" % ("kernel", "calls", "us", "share", "us each"))
for name, us in total.most_common():
    print("%-44s %6d %10.1f %6.1f%% %9.2f" % (name[:44], count[name], us, 100 * us / whole, us / count[name]))
EOF
}

if [ "${1:-}" = "--table" ]; then
    [ $# -eq 2 ] || { echo "usage: scripts/kernel-census.sh --table NCU.csv" >&2; exit 2; }
    table "$2"
    exit
fi
[ $# -ge 2 ] || { echo "usage: scripts/kernel-census.sh BUILD MODEL [TOKENS]" >&2; exit 2; }
BUILD=$1
MODEL=$2
TOKENS=${3:-3}
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
COUNT=${COUNT:-2500}
OUT=${OUT:-$(mktemp -d)}
[ -x "$NCU" ] || { echo "kernel-census: no ncu at $NCU (set NCU)" >&2; exit 1; }
csvf="$OUT/kernel-census.csv"
"$NCU" --metrics gpu__time_duration.sum --csv -c "$COUNT" \
    "$BUILD/bin/bench-model" "$MODEL" --backend cuda --runs 1 --pp 0 --tg "$TOKENS" > "$csvf" 2> "$OUT/ncu.err" || {
    echo "kernel-census: ncu failed (see $OUT/ncu.err)" >&2
    exit 1
}
echo "ncu CSV: $csvf"
table "$csvf"
