#!/usr/bin/env bash
# Creates ./.venv-xla: torch 2.9.0 with torch_xla 2.9.0 (the newest torch_xla on the registry; it
# pins its torch, which the main .venv's 2.13.0 is not), and this repository's scaletrain
# (editable) with what its XLA tests use. `bash scripts/setup.sh xla` runs it; `make test-xla`
# runs the XLA tests in it. The main .venv never installs torch_xla.
#
# torch 2.9.0 from the registry is the CUDA build: it brings about 6 GB of NVIDIA libraries that
# XLA on a CPU never loads (7.0 GB in all; 73 s with uv on the 2-core machine, 2026-11-29).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if [ -x .venv-xla/bin/python ] && .venv-xla/bin/python -c "import torch_xla, scaletrain, pytest" 2>/dev/null; then
  echo "setup: .venv-xla already has torch_xla and scaletrain (nothing to install)"
  exit 0
fi
start=$(date +%s)
"$python" -m venv .venv-xla
.venv-xla/bin/python -m pip install --quiet uv
pin="$(mktemp)"
trap 'rm -f "$pin"' EXIT
echo "torch==2.9.0" > "$pin"
.venv-xla/bin/python -m uv pip install --quiet --compile-bytecode --python .venv-xla/bin/python --constraint "$pin" \
  "torch==2.9.0" "torch_xla==2.9.0" -e ".[xla-test]"
echo "setup: .venv-xla has torch 2.9.0, torch_xla 2.9.0 and scaletrain (in $(( $(date +%s) - start )) s)"
