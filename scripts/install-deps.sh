#!/usr/bin/env bash
# Installs what hyper_ac needs on a fresh Debian 12 / Python 3.11 machine.
# Idempotent: each step checks first, so a second run takes seconds.
set -euo pipefail
PY=${PYTHON:-python3}

need_apt=()
# graphviz: `dot` draws the graph pictures of hyper_ac.display (and examples/inspect.ipynb).
# clang + libFuzzer: `make test-sanitize` and `make fuzz` (ASan/UBSan, tests/fuzz).
# libsimdjson-dev: the graph loader's fast path (core/src/graph_fast.cc).
# libmimalloc-dev: hyper-ac-plan's malloc (CMakeLists.txt; optional, ~20% off a 1M-node plan).
for pkg in libboost-graph-dev nlohmann-json3-dev libsimdjson-dev libmimalloc-dev catch2 graphviz clang libfuzzer-14-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[install] apt: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# torch is pinned exactly: the CPU build lies on disk; anything looser pulls a CUDA build.
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '2.13.0' else 1)" 2>/dev/null; then
  echo "[install] pip: torch==2.13.0"
  "$PY" -m pip install -q torch==2.13.0
fi

# transformers is pinned too: 5.25 wraps every attention layer in the `kernels` package's hub-kernel
# forward, which writes a module global inside the layer, so gradient_checkpointing_enable() under
# torch.compile(fullgraph=True) fails in dynamo ("HOP: Unsafe side effect"), stock compile as much as
# hyper_ac (docs/torch-compat.md); the committed results were measured on 5.24.0.
TRANSFORMERS=5.24.0
if ! "$PY" -c "import transformers, sys; sys.exit(0 if transformers.__version__ == '$TRANSFORMERS' else 1)" 2>/dev/null; then
  echo "[install] pip: transformers==$TRANSFORMERS"
  "$PY" -m pip install -q "transformers==$TRANSFORMERS" torch==2.13.0
fi

# nbclient + ipykernel + nbformat: tests/python/test_notebook.py executes examples/inspect.ipynb headlessly.
# accelerate: transformers' Trainer needs it (tests/python/test_hf_trainer.py).
# pytest-xdist: make test-python runs the modules on two processes.
pip_pkgs=(pybind11 scikit-build-core pyyaml pytest pytest-xdist numpy networkx accelerate matplotlib tqdm nbclient ipykernel nbformat)
missing=()
for p in "${pip_pkgs[@]}"; do
  mod=$p
  case $p in
    scikit-build-core) mod=scikit_build_core ;;
    pyyaml) mod=yaml ;;
    pytest-xdist) mod=xdist ;;
  esac
  "$PY" -c "import $mod" 2>/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install] pip: ${missing[*]}"
  # torch==2.13.0 stays pinned so no dependency drags a newer build in.
  "$PY" -m pip install -q "${missing[@]}" torch==2.13.0
fi
