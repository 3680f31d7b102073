"""scaletrain as a package: the wheel `python -m build` makes, installed into a fresh virtual
environment, trains the default recipe and the char-gpt recipe (its recipes and offline corpus
inside the wheel) from a folder that is not the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.usefixtures("processes")   # every test here starts processes

REPO = Path(__file__).resolve().parent.parent


def _clean_env(**extra) -> dict:
    """No PYTHONPATH (the repository must not be importable) and one thread per process. Bytecode
    is written as a user's Python writes it (this project's machines set PYTHONDONTWRITEBYTECODE):
    torch is installed without compiling its modules (13 s instead of 31 here), and the first
    command compiles those it imports, for the next."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def _ok(args, cwd, timeout=600, **env) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_clean_env(**env))
    assert done.returncode == 0, f"{args}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.timeout(900)
def test_the_built_wheel_installs_the_command_and_trains_outside_the_repo(tmp_path):
    pytest.importorskip("build")
    # Build from a copy of what the package is made of, so the repository gets no build/ folder.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "scaletrain", source / "scaletrain", ignore=shutil.ignore_patterns("__pycache__"))
    _ok([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist")], source)
    (wheel,) = (tmp_path / "dist").glob("scaletrain-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "scaletrain/recipes/mnist1d-cnn.toml" in names and "scaletrain/data/text.py" in names
    assert any(n.endswith("entry_points.txt") for n in names)

    # A fresh environment: this machine's torch (the CPU build is never swapped for a CUDA one),
    # then the wheel with the default recipe's extra, as scripts/setup.sh installs.
    venv = tmp_path / "venv"
    _ok([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    _ok([str(python), "-m", "pip", "install", "--quiet", "--no-compile", f"torch=={torch.__version__.split('+')[0]}"], tmp_path)
    pin = tmp_path / "pin.txt"
    pin.write_text(f"torch=={torch.__version__}\n")
    install = [sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", str(python), "--constraint",
               str(pin), f"{wheel}[mnist1d]"]
    if subprocess.run(install, capture_output=True, env=_clean_env()).returncode != 0:
        _ok([str(python), "-m", "pip", "install", "--quiet", f"{wheel}[mnist1d]"], tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _ok([str(python), "-c", "import scaletrain; print(scaletrain.__file__)"], elsewhere).stdout.strip()
    assert where.startswith(str(venv)), where
    command = venv / "bin" / "scaletrain"
    default = _ok([str(command), "train", "--epochs", "1", "--no-progress"], elsewhere)
    assert "cnn1d" in default.stdout and "mnist1d" in default.stdout
    gpt = _ok([str(command), "train", "--recipe", "char-gpt", "--epochs", "1", "--train-subset", "256", "--no-progress"],
              elsewhere)
    assert "char-corpus" in gpt.stdout
    assert len(list((elsewhere / "scaletrain-runs").glob("*/model.pt"))) == 2
