#!/usr/bin/env bash
# The first run on a GPU host, before any sweep: what a closing note needs, in under 8 minutes on one GPU.
#   scripts/gpu_check.sh [OUTDIR]        (OUTDIR default: a new temporary folder; nothing is written elsewhere)
#   scripts/gpu_check.sh --dry-run [OUTDIR]   every command it would run, and the tools it needs, checked;
#                                             exits 1 naming each one missing (runs nothing on the GPU)
# Prints the host's software, `bench doctor --device cuda` (devices, NCCL, matmul limits, every backend's
# kernels, every mode) and gpu-smoke at 8K tokens, one round, both backends where FLA imports; the result
# file lands in OUTDIR. Run from anywhere; the checkout is found from this script. Bash 4.2 or newer (an
# empty array under `set -u` is expanded as ${a[@]+"${a[@]}"}: bash before 4.4 calls "${a[@]}" unbound).
set -uo pipefail
cd "$(dirname "$0")/.."
dry=0
if [ "${1:-}" = "--dry-run" ]; then
    dry=1
    shift
fi
export PYTHONPATH=".:.fla-site${PYTHONPATH:+:$PYTHONPATH}"
status=0

# run CMD...: runs it (a failure sets the exit status and the check goes on), or under --dry-run prints it.
run() {
    if [ "$dry" = 1 ]; then
        local arg line="+"
        for arg in "$@"; do
            case $arg in
                *\'*) line+=" $(printf %q "$arg")" ;;
                *[!A-Za-z0-9_./=:,@%+-]*) line+=" '$arg'" ;;
                *) line+=" $arg" ;;
            esac
        done
        echo "$line"
        return 0
    fi
    "$@" || status=1
}

if [ "$dry" = 1 ]; then
    # What the real run needs, checked without touching a GPU (no CUDA context is created).
    missing=0
    need() { echo "missing: $1" >&2; missing=$((missing + 1)); }
    command -v python >/dev/null || need "python (on PATH: the interpreter with the node's torch)"
    command -v nvidia-smi >/dev/null || need "nvidia-smi (NVIDIA's driver tools, on PATH)"
    if command -v python >/dev/null; then
        if ! python -c "import torch" 2>/dev/null; then
            need "torch (python -c 'import torch' fails)"
        elif [ -z "$(python -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null)" ]; then
            need "a CUDA build of torch ($(python -c 'import torch; print(torch.__version__)') has no CUDA)"
        fi
        absent=$(python -c "from bench.dependencies import missing; print(' '.join(missing()))" 2>/dev/null) ||
            absent="bench (python -c 'import bench.dependencies' fails in $(pwd))"
        [ -z "$absent" ] || need "bench's dependencies: $absent (docs/clusters.md: the wheelhouse)"
    fi
    if command -v python >/dev/null && python -c "import importlib.util as u; exit(u.find_spec('fla') is None)" \
        2>/dev/null; then
        echo "fla: found (both backends run)"
    else
        echo "fla: not found (gdn_cp only; optional: docs/clusters.md puts it in .fla-site)"
    fi
fi

if [ "$dry" = 1 ]; then
    out=${1:-OUTDIR}
    [ -n "${1:-}" ] || echo "OUTDIR: a new folder (mktemp -d -t gpu-check-XXXX)"
else
    out=${1:-$(mktemp -d -t gpu-check-XXXX)}
    mkdir -p "$out"
fi

echo "== host"
run date -u
run nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
host_software() {
    python - <<'PY'
import importlib.metadata as md, platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"nccl {'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-'}")
for name in ("triton", "fla-core", "transformers", "pydantic"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} absent")
PY
}
if [ "$dry" = 1 ]; then
    echo "+ python - (python, torch, CUDA and NCCL versions; triton, fla-core, transformers, pydantic)"
else
    host_software || status=1
fi

echo "== bench doctor --device cuda"
run python -m bench doctor --device cuda --timeout 300

echo "== gpu-smoke, 8K tokens, one round"
filter=()
if [ "$dry" = 1 ]; then
    python -c "import importlib.util as u; exit(u.find_spec('fla') is None)" 2>/dev/null ||
        filter=(--filter backend=gdn_cp)
else
    python -c "import fla" 2>/dev/null || {
        echo "fla does not import: gdn_cp only"
        filter=(--filter backend=gdn_cp)
    }
fi
run python -m bench run gpu-smoke --set 'seq_len=[8192]' --set rounds=1 --set warmup=1 --set repeat=3 \
    ${filter[@]+"${filter[@]}"} --output "$out/gpu-smoke.json"
if [ "$dry" = 1 ]; then
    run python -m bench show "$out/gpu-smoke.json"
    if [ "$missing" -gt 0 ]; then
        echo "== dry run: $missing missing (above); install them before the real run" >&2
        exit 1
    fi
    echo "== dry run: every tool found"
    exit 0
fi
[ -f "$out/gpu-smoke.json" ] && python -m bench show "$out/gpu-smoke.json"
echo "== result file: $out/gpu-smoke.json (exit $status)"
exit $status
