#!/usr/bin/env bash
# The first run on a GPU host, before any sweep: what a closing note needs, in under 8 minutes on one GPU.
#   scripts/gpu_check.sh [OUTDIR]        (OUTDIR default: a new temporary folder; nothing is written elsewhere)
# Prints the host's software, `bench doctor --device cuda` (devices, NCCL, matmul limits, every backend's
# kernels, every mode) and gpu-smoke at 8K tokens, one round, both backends where FLA imports; the result
# file lands in OUTDIR. Run from anywhere; the checkout is found from this script.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d -t gpu-check-XXXX)}
mkdir -p "$out"
export PYTHONPATH=".:.fla-site${PYTHONPATH:+:$PYTHONPATH}"
status=0

echo "== host"
date -u
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv || status=1
python - <<'PY' || status=1
import importlib.metadata as md, platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"nccl {'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-'}")
for name in ("triton", "fla-core", "transformers", "pydantic"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} absent")
PY

echo "== bench doctor --device cuda"
python -m bench doctor --device cuda --timeout 300 || status=1

echo "== gpu-smoke, 8K tokens, one round"
filter=()
python -c "import fla" 2>/dev/null || { echo "fla does not import: gdn_cp only"; filter=(--filter backend=gdn_cp); }
python -m bench run gpu-smoke --set 'seq_len=[8192]' --set rounds=1 --set warmup=1 --set repeat=3 \
    "${filter[@]}" --output "$out/gpu-smoke.json" || status=1
[ -f "$out/gpu-smoke.json" ] && python -m bench show "$out/gpu-smoke.json"
echo "== result file: $out/gpu-smoke.json (exit $status)"
exit $status
