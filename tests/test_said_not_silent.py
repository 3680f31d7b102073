"""What was accepted without a word, or said misleadingly (the red team's fifth pass, issue 91),
through the real CLI: each now one true line, or a note where the run may go on."""

import json
import shutil
import subprocess

import pytest

from tests.processes import DIGITS_MLP, run

pytestmark = pytest.mark.usefixtures("processes")
QUICK = [*DIGITS_MLP, "--epochs", "1", "--no-record"]


def _error(result) -> str:
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-1500:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("value", ["0", "abc", "-3"])
def test_omp_num_threads_is_checked_before_torch_reads_it(tmp_path, value):
    line = _error(run(["train", *QUICK, "--run-dir", "r"], tmp_path, cold=True, OMP_NUM_THREADS=value))
    assert f"OMP_NUM_THREADS={value!r} is not a whole number of threads >= 1" in line
    assert not (tmp_path / "r").exists()


def test_threads_above_the_cores_are_said_and_a_capped_count_recorded_as_run(tmp_path):
    import os
    cores = len(os.sched_getaffinity(0))
    named = run(["train", *QUICK, "--threads", "999", "--run-dir", "a"], tmp_path)
    assert named.returncode == 0, named.stderr[-2000:]
    assert f"note: --threads 999 asks for 999 threads on {cores} usable core(s)" in named.stdout
    env = run(["train", *QUICK, "--run-dir", "b"], tmp_path, cold=True, OMP_NUM_THREADS="100000")
    assert env.returncode == 0 and "libgomp" not in env.stderr, env.stderr[-2000:]
    assert "OMP_NUM_THREADS=100000 asks for 100000 threads" in env.stdout
    assert f"threads {cores} (OMP_NUM_THREADS=100000, capped at {cores} by torch)" in env.stdout


def test_tf32_on_a_cpu_says_it_trains_as_fp32(tmp_path):
    result = run(["train", *QUICK, "--precision", "tf32", "--run-dir", "a"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "note: tf32 on a CPU: TF32 is a format of NVIDIA's tensor cores" in result.stdout


def test_a_config_that_is_a_folder_or_a_device_is_named_so(tmp_path):
    (tmp_path / "configs").mkdir()
    assert "config file configs is a folder" in _error(run(["train", "--config", "configs"], tmp_path))
    assert "config file /dev/null is not a regular file" in _error(run(["train", "--config", "/dev/null"], tmp_path))
    assert "does not exist" in _error(run(["train", "--config", "missing.toml"], tmp_path))


def test_numbers_too_long_to_be_values_are_one_line(tmp_path):
    (tmp_path / "big.json").write_text('{"measured_step_s": ' + "9" * 5001 + "}")
    (tmp_path / "big.toml").write_text("epochs = " + "9" * 5001 + "\n")
    measured = _error(run(["scaling", "--measured", "big.json"], tmp_path))
    assert "holds a number too long to be one of its values" in measured
    assert "holds a number too long to be a configuration value" in _error(run(["train", "--config", "big.toml"],
                                                                               tmp_path))


def test_a_resume_takes_auto_as_what_it_resolved_to_and_names_a_damaged_saved_value(tmp_path):
    base = [*QUICK, "--checkpoint-every", "10", "--run-dir", "a"]
    assert run(["train", *base], tmp_path).returncode == 0
    spelled = run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "2", "--precision", "auto",
                   "--no-record"], tmp_path)
    assert spelled.returncode == 0, spelled.stderr[-2000:]
    # A NaN LR written into the folder with its digest updated: once "optim.lr: nan -> nan".
    from scaletrain.config import config_digest
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    config["optim"]["lr"] = float("nan")
    (tmp_path / "a" / "config.json").write_text(json.dumps(config))
    meta = json.loads((tmp_path / "a" / "run.json").read_text())
    meta["config_sha256"] = config_digest(config)
    (tmp_path / "a" / "run.json").write_text(json.dumps(meta))
    line = _error(run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "3", "--no-record"], tmp_path))
    assert "a's saved configuration is not one a run could have started with (config key 'optim.lr' must be a " \
           "finite number (got nan))" in line and "nan -> nan" not in line


def test_another_runs_checkpoint_of_the_same_configuration_is_refused_by_its_run_id(tmp_path):
    """Copied into a run's own checkpoints (no owner.json of its own to tell): its COMMITTED names
    the run that took it."""
    base = [*QUICK, "--checkpoint-every", "5"]
    for folder, run_id in (("a", "run-a"), ("b", "run-b")):
        made = run(["train", *base, "--run-dir", folder, "--run-id", run_id], tmp_path)
        assert made.returncode == 0, made.stderr[-2000:]
    theirs = sorted((tmp_path / "a" / "checkpoints").glob("step-*"))[-1]
    shutil.copytree(theirs, tmp_path / "b" / "checkpoints" / "step-000009999")
    line = _error(run(["train", "--run-dir", "b", "--resume", "auto", "--epochs", "2", "--no-record"], tmp_path))
    assert "step-000009999 was taken by run run-a, not by this run (run-b)" in line


@pytest.mark.parametrize("step", [float("nan"), "12"])
def test_a_committed_marker_whose_step_is_not_a_count_is_skipped_as_damaged(tmp_path, step):
    base = [*QUICK, "--checkpoint-every", "5", "--run-dir", "a"]
    assert run(["train", *base], tmp_path).returncode == 0
    newest = sorted((tmp_path / "a" / "checkpoints").glob("step-*"))[-1]
    marker = json.loads((newest / "COMMITTED").read_text())
    marker["meta"]["global_step"] = step
    (newest / "COMMITTED").write_text(json.dumps(marker))
    resumed = run(["train", "--run-dir", "a", "--resume", "auto", "--epochs", "2", "--no-record"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"skipping damaged checkpoint {newest.relative_to(tmp_path)}" in resumed.stderr
    assert f"gives global_step {step!r}, not a whole number >= 0" in resumed.stderr


def test_a_lightning_module_without_training_step_is_one_line_of_ours(tmp_path):
    (tmp_path / "nostep.py").write_text(
        "import lightning as L, torch\nfrom torch import nn\n"
        "class NoStep(L.LightningModule):\n"
        "    def __init__(self):\n        super().__init__()\n        self.net = nn.Linear(16, 4)\n"
        "    def configure_optimizers(self):\n        return torch.optim.SGD(self.parameters(), lr=0.1)\n")
    line = _error(run(["train", "--model", "nostep:NoStep", "--data", "lit_classifier:Blobs", "--epochs", "1",
                       "--no-record", "--no-progress"], tmp_path, PYTHONPATH=str(tmp_path)))
    assert line == ("scaletrain: error: NoStep defines no training_step: scaletrain trains on the loss it returns, "
                    "as Lightning does; define training_step(self, batch, batch_idx)")


def test_nan_in_a_validation_split_is_named(tmp_path):
    (tmp_path / "nanval.py").write_text(
        "import numpy as np, torch\n"
        "class Rows(torch.utils.data.Dataset):\n"
        "    num_classes = 2\n"
        "    def __init__(self, x, y): self.x, self.y = torch.tensor(x), torch.tensor(y)\n"
        "    def __len__(self): return len(self.y)\n"
        "    def __getitem__(self, i): return self.x[i], self.y[i]\n"
        "def splits(lazy=True):\n"
        "    x = np.random.default_rng(0).normal(size=(512, 8)).astype(np.float32)\n"
        "    y = x[:, 0].copy() if not lazy else (x[:, 0] > 0).astype(np.int64)\n"
        "    xv, yv = x[:64].copy(), y[:64].copy()\n"
        "    if lazy: xv[3, 2] = np.nan\n"
        "    else: yv[5] = np.nan\n"
        "    return {'train': Rows(x, y), 'val': Rows(xv, yv)} if lazy else {'train': (x, y), 'val': (x[:64], yv)}\n")
    env = {"PYTHONPATH": str(tmp_path)}
    quick = ["--epochs", "1", "--no-record", "--no-progress"]
    lazy = _error(run(["train", "--model", "mlp", "--data", "nanval:splits", *quick, "--run-dir", "a"], tmp_path,
                      **env))
    assert "the validation split gives val_loss nan after epoch 1, while the training loss is" in lazy
    arrays = _error(run(["train", "--model", "mlp", "--data", "nanval:splits", "--data-option", "lazy=false",
                         *quick, "--run-dir", "b"], tmp_path, **env))
    assert "nanval:splits (val): 1 target value(s) are inf or NaN" in arrays


def test_a_built_in_models_option_torch_refuses_is_one_line_without_torchs_internals(tmp_path):
    line = _error(run(["train", "--model-option", "channels=-5", "--epochs", "1", "--no-record"], tmp_path))
    assert line == ("scaletrain: error: model 'cnn1d': model.options {'channels': -5} cannot build it (Trying to "
                    "create tensor with negative dimension -5: [-5, 1, 3])")


def test_a_full_disk_at_the_run_folders_lock_is_one_line(tmp_path):
    """Every block taken: the folder's checks (empty files) pass, and the lock's holder line once
    raised a traceback; it is a help, left out, and the first write that needs room says so."""
    import os
    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.decode().strip()})")
    try:
        stat = os.statvfs(disk)
        with (disk / "filler").open("wb") as fh:
            try:
                fh.write(bytes(stat.f_bavail * stat.f_frsize))
            except OSError:
                pass
        result = run(["train", *QUICK, "--run-dir", str(disk / "run")], tmp_path)
        assert result.returncode in (1, 2), result.stderr[-2000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "No space left on device" in lines[0], result.stderr[-2000:]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
