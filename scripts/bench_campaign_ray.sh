#!/usr/bin/env bash
# The campaign's time in the local process pool and on a 2-node Ray cluster on this machine
# (two raylets of 1 CPU each: `ray start --head` plus `ray start --address`), the same shards,
# in one run: the wall of each, their ratio and whether the two JSON documents are identical
# (but for each finding's detect.cpu_s, a measurement: kvbound.records.reproducible).
#   scripts/bench_campaign_ray.sh [campaign args...]   (default: the full matrix 0.21.0..0.33.0)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${KVBOUND_VENV:-.venv}/bin
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(--vllm 0.21.0..0.33.0 --requests 200 --shrink-budget 20 --seed 0)
OUT=${BENCH_OUT:-$(mktemp -d)}  # BENCH_OUT=DIR keeps both documents and their findings
mkdir -p "$OUT"
export RAY_AUTH_MODE=token  # Ray 2.5x+ clusters authenticate every node with one token
"$BIN/ray" get-auth-token --generate >/dev/null 2>&1 || true
trap '"$BIN/ray" stop --force >/dev/null 2>&1 || true; [ -n "${BENCH_OUT:-}" ] || rm -rf "$OUT"' EXIT

t0=$(date +%s.%N)
"$BIN/kvbound" campaign "${ARGS[@]}" --workers 2 --quiet --json "$OUT/local.json" --out "$OUT/lf" >/dev/null || true
t1=$(date +%s.%N)
"$BIN/ray" start --head --num-cpus 1 --port 6390 --include-dashboard false --disable-usage-stats >/dev/null
"$BIN/ray" start --address 127.0.0.1:6390 --num-cpus 1 --disable-usage-stats >/dev/null
nodes=$("$BIN/python" -c 'import ray; ray.init(address="auto", log_to_driver=False); print(len([n for n in ray.nodes() if n["Alive"]]))' 2>/dev/null)
t2=$(date +%s.%N)
"$BIN/kvbound" campaign "${ARGS[@]}" --ray auto --quiet --json "$OUT/ray.json" --out "$OUT/rf" >/dev/null || true
t3=$(date +%s.%N)
"$BIN/python" - "$t0" "$t1" "$t2" "$t3" "$nodes" "$OUT" "${ARGS[*]}" <<'PY'
import json, sys
from kvbound.records import reproducible
t0, t1, t2, t3 = map(float, sys.argv[1:5])
nodes, out, args = sys.argv[5], sys.argv[6], sys.argv[7]
local, ray = (reproducible(json.load(open(f"{out}/{n}.json"))) for n in ("local", "ray"))
cells = sum(len(v) for v in local["matrix"].values())  # release -> layout -> cell
print(f"kvbound campaign {args}")
print(f"  local pool, 2 workers:          {t1 - t0:7.1f} s")
print(f"  Ray cluster, {nodes} nodes x 1 CPU:   {t3 - t2:7.1f} s (cluster start not counted)")
print(f"  ratio Ray / local:              {(t3 - t2) / (t1 - t0):7.2f}")
print(f"  matrix entries: {cells}; JSON identical: {local == ray}")
PY
