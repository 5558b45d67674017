#!/usr/bin/env bash
# The CUDA checks of the batched impl, for a machine with a GPU (none was lent while this
# was written: every line below is untested on CUDA). From the repository root, with the
# project installed in .venv (a CUDA build of torch: `pip install torch` on the GPU host):
#
#   bash scripts/gpu_check.sh [OUT_DIR]        # about 5 minutes; writes OUT_DIR/*.json
#
# 1. the CUDA path agrees with the CPU one (tests/test_impl.py::test_cuda_agrees_with_cpu)
# 2. kvbound bench --device cuda: impl vs spec at 1e3..1e6 request-groups, block slots/s
#    (issue 13's GPU goal: >= 1e9 padded block slots per second, "padded_slots_per_s")
# 3. kvbound diff --device cuda on 1,000,000 cases (spec in worker processes on the CPUs)
#    and the default exhaustive scope
set -euo pipefail
OUT=${1:-${OUT:-out/gpu}}
mkdir -p "$OUT"
PY=.venv/bin/python
KV=.venv/bin/kvbound
$PY - <<'PYEOF'
import torch, sys
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch.cuda.is_available() is False (CPU-only torch or no GPU); nothing to check")
print("cuda:", torch.cuda.get_device_name(0), "torch", torch.__version__)
PYEOF
nvidia-smi --query-gpu=name,memory.total,utilization.gpu --format=csv || true
$PY -m pytest -q tests/test_impl.py -k "cuda" 2>&1 | tail -3
# a 5 s warm-up shapes nothing; the bench takes the best of repeats per size
$KV bench --device cuda --threads 1 --json "$OUT/bench-cuda.json" 2>&1 | tee "$OUT/bench-cuda.txt"
$PY - "$OUT/bench-cuda.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
for row in d["sizes"]:
    print(f"{row['request_groups']:>10,} request-groups: {row['padded_slots_per_s']:.3e} padded block slots/s, "
          f"ratio {row['ratio']:.0f}x")
best = max(r["padded_slots_per_s"] for r in d["sizes"])
print(f"GPU goal (>= 1e9 block slots/s): {'met' if best >= 1e9 else 'NOT met'} ({best:.3e})")
PYEOF
$KV diff --device cuda --cases 1000000 --symbolic-cases 0 --no-save --json "$OUT/diff-1m-cuda.json" 2>&1 | tail -12 | tee "$OUT/diff-1m-cuda.txt"
$KV diff --device cuda --exhaustive --against spec --no-save --json "$OUT/diff-exhaustive-cuda.json" 2>&1 | tail -6 | tee "$OUT/diff-exhaustive-cuda.txt"
