#!/usr/bin/env bash
# Downloads, for the GPU machine's Python 3.12 on manylinux x86-64, exactly the wheels its image
# lacks that `python -m benchmarks.gpu` needs, into benchmarks/gpu/wheels/ (ignored by git: *.whl).
# torch, Lightning, numpy, rich, psutil, nvidia-ml-py, matplotlib, scipy, PyYAML, tqdm and
# MarkupSafe are in the image (the device library's KINDS.md lists it) and are never downloaded:
# the kit installs these wheels with --no-deps into a private folder and leaves the image's torch alone.
#
#   bash benchmarks/gpu/wheels.sh          # then carry benchmarks/gpu/wheels (README.md beside this)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="$here/wheels"
mkdir -p "$dest"
python="${PYTHON:-python3}"
# name==version: scaletrain's own needs (tomli-w writes configs), the default recipe's data set
# (mnist1d), and autotune's search (optuna and the packages it needs that the image lacks).
wheels=(
  "tomli-w==1.2.0"
  "mnist1d==0.0.2.post1"
  "optuna==5.0.0"
  "alembic==1.20.1"
  "colorlog==6.12.0"
  "Mako==1.4.3"
  "SQLAlchemy==2.1.9"
  # --precision fp8 (part fp8): torchao's float8 training, which needs torch >= 2.11 from 0.17 on
  "torchao==0.17.0"
)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$dest" "${wheels[@]}"
ls -1 "$dest"
du -sh "$dest"
