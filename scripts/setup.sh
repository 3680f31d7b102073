#!/usr/bin/env bash
# Creates ./.venv and installs scaletrain into it (editable) with the extras named in $1
# (uv where available, else pip).
#
# Torch is never pulled from the registry by accident: a torch>=2.6 already installed for the
# system Python (the CUDA build on a GPU box) is reused through --system-site-packages; on a box
# without one, the pinned local CPU build torch==2.13.0 is installed first, so that the
# "torch>=2.6" requirement is already satisfied when scaletrain itself is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-all}"
python="${PYTHON:-python3}"
if [ "$extras" = "xla" ]; then   # an environment of its own (torch_xla pins its torch): .venv-xla
  exec bash scripts/setup-xla.sh
fi

has_torch() {
  "$1" - <<'PY' 2>/dev/null
import sys, torch
major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 6) else 1)
PY
}

# Already set up: this repository's scaletrain is installed and every requirement of the extras
# asked for is there, installed from this pyproject.toml. Then nothing is reinstalled: uv rebuilds
# an editable package on every call (about 5 s here), and a reinstall under a running scaletrain (a
# doc line's `make train` beside the other doc lines) could make it vanish for a moment
# (scripts/setup_stamp.py).
if [ -x .venv/bin/python ] && .venv/bin/python scripts/setup_stamp.py check "$extras" 2>/dev/null; then
  echo "setup: .venv already has scaletrain[${extras}] (nothing to install)"
  exit 0
fi

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
# scaletrain and its extras: with uv where it can be had (about 2 s instead of about 19 s for the
# default recipe's extras on the 2-core machine), else pip. The torch in place is pinned as a
# constraint, so uv can only keep it: if it cannot see it (a torch reused from the system), the
# pin fails to resolve and pip, which sees it, does the install instead.
torch_version="$(.venv/bin/python -W ignore -c 'import torch; print(torch.__version__)')"  # (numpy may not be there yet)
pin="$(mktemp)"
trap 'rm -f "$pin"' EXIT
echo "torch==${torch_version}" > "$pin"
# Bytecode is compiled at install, as pip does by default and uv only when asked: where Python may
# not write it (PYTHONDONTWRITEBYTECODE, set on this project's machines), every process would otherwise
# compile numpy, rich, optuna, SQLAlchemy and scaletrain from source again (5 s of an autotune's
# start on the 2-core CPU).
if .venv/bin/python -m pip install --quiet uv 2>/dev/null \
    && .venv/bin/python -m uv pip install --quiet --compile-bytecode --python .venv/bin/python --constraint "$pin" \
         -e ".[${extras}]"; then
  echo "setup: installed scaletrain[${extras}] with uv (torch ${torch_version} kept)"
else
  echo "setup: installing scaletrain[${extras}] with pip"
  .venv/bin/python -m pip install --quiet -e ".[${extras}]"
fi
.venv/bin/python -m compileall -q scaletrain > /dev/null   # the editable package's own bytecode
.venv/bin/python scripts/setup_stamp.py write "$extras"   # what is now there, for the check above
