#!/usr/bin/env bash
# Creates ./.venv and installs scaletrain into it (editable) with the extras named in $1.
#
# Torch is never pulled from the registry by accident: a torch>=2.6 already installed for the
# system Python (the CUDA build on a GPU box) is reused through --system-site-packages; on a box
# without one, the pinned local CPU build torch==2.13.0 is installed first, so that the
# "torch>=2.6" requirement is already satisfied when scaletrain itself is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-all}"
python="${PYTHON:-python3}"

has_torch() {
  "$1" - <<'PY' 2>/dev/null
import sys, torch
major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 6) else 1)
PY
}

if [ ! -x .venv/bin/python ]; then
  if has_torch "$python"; then
    echo "setup: reusing the installed torch ($("$python" -c 'import torch; print(torch.__version__)'))"
    "$python" -m venv --system-site-packages .venv
  else
    "$python" -m venv .venv
  fi
fi
if ! has_torch .venv/bin/python; then
  echo "setup: no torch>=2.6 found; installing the CPU build torch==2.13.0"
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
fi
.venv/bin/python -m pip install --quiet -e ".[${extras}]"
