#!/usr/bin/env bash
# CI's third environment (.ci/run): an offline cluster node, simulated on this CPU machine, set up exactly as
# docs/clusters.md says, so that the page is proved rather than described:
#   1. the wheelhouse, built here with pip's usual indexes (scripts/wheelhouse.py: bench's needs, the tests'
#      plugins, FLA, and the build backend that `pip install -e .` needs);
#   2. the node as it comes: a fresh venv with its own torch (the local CPU wheel: CI never downloads a CUDA
#      build), Triton and transformers, and none of pydantic, pytest-benchmark, jsonschema; bench there says
#      in one line what is missing;
#   3. every pip index off (PIP_CONFIG_FILE=/dev/null, PIP_NO_INDEX, --no-index): bench installed from the
#      wheelhouse as the page says, then `bench --help`, `bench list`, `bench doctor --device cpu` and a
#      handful of tests with `-p no:benchmark`;
#   4. FLA into a folder of its own (pip install --target, as documented) and `bench doctor --device cpu`
#      with it on PYTHONPATH, as scripts/gpu_check.sh runs it: no check may fail.
# Everything goes into a temporary folder, removed at the end; nothing is written into the checkout.
# The node's Python is the one the local torch wheel is built for: PYTHON (default python3.11) and the
# wheel from TORCH_WHEELS (default /opt/wheels). The GPU host's Python 3.12 with torch 2.11 was checked by
# hand (docs/clusters.md).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3.11}
wheels=${TORCH_WHEELS:-/opt/wheels}
work=$(mktemp -d -t offline-node-XXXX)
trap 'rm -rf "$work"' EXIT
start=$SECONDS
step() { echo "== offline node, $((SECONDS - start)) s: $*"; }
fail() {
    echo "offline node: $*" >&2
    exit 1
}
# logged NAME CMD...: CMD's output into NAME.txt, shown whole when it fails (then the script stops)
logged() {
    local name=$1
    shift
    "$@" >"$work/$name.txt" 2>&1 || {
        cat "$work/$name.txt"
        fail "$name failed: $*"
    }
}

version=$("$python" -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
tag="cp${version/./}"
torch_wheel=$(find "$wheels" -maxdepth 1 -name "torch-*+cpu-$tag-$tag-*.whl" 2>/dev/null | sort | tail -n 1)
[ -n "$torch_wheel" ] || fail "no CPU torch wheel for Python $version in $wheels (CI never downloads a CUDA torch)"

step "the wheelhouse for Python $version (scripts/wheelhouse.py, pip's usual indexes)"
house="$work/wheelhouse"
logged wheelhouse "$python" scripts/wheelhouse.py --dest "$house" --python "$version" --extra fla --extra dev
tail -n 4 "$work/wheelhouse.txt"

step "the node as it comes: $(basename "$torch_wheel"), Triton and transformers"
"$python" -m venv "$work/node"
node="$work/node/bin/python"
logged node-install "$node" -m pip install --disable-pip-version-check "$torch_wheel" "triton==3.9.0" \
    "transformers>=5.17,<6"
# transformers pulls pydantic in (huggingface_hub's command line); the node of issue 45 had none
logged node-uninstall "$node" -m pip uninstall --yes pydantic pydantic-core
for module in pydantic pytest_benchmark jsonschema; do
    "$node" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$module') is not None)" ||
        fail "$module is installed before the wheelhouse: the node must start without it"
done

step "bench before its dependencies: one line naming them"
if said=$(PYTHONPATH=. "$node" -m bench --help 2>&1); then
    fail "bench started without its dependencies"
fi
echo "$said"
[ "$(printf '%s\n' "$said" | wc -l)" -eq 1 ] && [[ $said == "error: bench needs "*pydantic* ]] &&
    [[ $said == *"--no-index --find-links wheelhouse"* ]] || fail "not one line naming pydantic and the offline install"

step "every pip index off: bench and the tests' plugins from the wheelhouse (docs/clusters.md)"
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_INDEX_URL
logged install "$node" -m pip install --no-index --find-links "$house" -e . -r "$house/requirements-dev.txt"
bench="$work/node/bin/bench"
[ -x "$bench" ] || fail "pip install -e . installed no bench command"

step "bench --help, bench list"
logged help "$bench" --help
head -n 1 "$work/help.txt"
logged list "$bench" list

step "bench doctor --device cpu"
logged doctor "$bench" doctor --device cpu
tail -n 1 "$work/doctor.txt"

step "a handful of tests, -p no:benchmark"
logged tests "$node" -m pytest -q -p no:cacheprovider -p no:benchmark tests/bench/test_dependencies.py \
    tests/scripts/test_wheelhouse.py tests/gdn_cp/distributed/test_platform.py tests/gdn_cp/ops/test_backends.py
tail -n 1 "$work/tests.txt"

step "FLA into a folder of its own (--target), and bench doctor --device cpu with it on PYTHONPATH"
logged fla-install "$node" -m pip install --no-index --find-links "$house" --target "$work/fla-site" \
    -r "$house/requirements-fla.txt"
PYTHONPATH=".:$work/fla-site" "$node" -c "import fla, transformers; print('fla', fla.__version__, 'imports')"
PYTHONPATH=".:$work/fla-site" logged doctor-fla "$bench" doctor --device cpu
grep -E "^│ kernels │ (fla|transformers) " "$work/doctor-fla.txt" || true
tail -n 1 "$work/doctor-fla.txt"
step "done"
