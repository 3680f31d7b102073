import json
import os
import subprocess
import sys

import numpy as np
import pytest

from scaletrain.cli.main import build_parser, main
from scaletrain.cli.train import config_from_args
from tests.test_data import make_idx_folder, write_idx

REQUIRED_SUMMARY_KEYS = {"reached_target", "time_to_target_s", "best_val_accuracy", "images_per_sec", "warmup_s",
                         "peak_memory_bytes", "precision", "device", "epochs_run", "skipped_steps"}


def run_cli(*args, cwd=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "scaletrain", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


@pytest.mark.usefixtures("processes")
def test_train_end_to_end_writes_summary_metrics_and_model(tmp_path):
    summary = tmp_path / "out" / "summary.json"
    result = run_cli("train", "--model", "mlp", "--data", "digits", "--epochs", "3", "--batch-size", "64",
                     "--lr", "0.003", "--precision", "bf16-mixed", "--target-accuracy", "0.5",
                     "--steps-per-execution", "2", "--run-dir", str(tmp_path / "run"),
                     "--summary-json", str(summary), "--metrics-format", "csv", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(summary.read_text())
    assert REQUIRED_SUMMARY_KEYS <= set(data)
    assert data["precision"] == "bf16-mixed" and data["reached_target"] is True
    assert 0 < data["time_to_target_s"] and data["images_per_sec"] > 0 and data["peak_memory_bytes"] > 0
    assert "Run summary" in result.stdout and "images/sec" in result.stdout
    csv_lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert csv_lines[0].startswith("epoch,") and len(csv_lines) == 1 + data["epochs_run"]
    import torch

    from scaletrain.models import build_model
    state = torch.load(tmp_path / "run" / "model.pt")
    build_model("mlp", (1, 8, 8), 10).load_state_dict(state)


def test_toml_config_with_flag_override(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('epochs = 7\nbatch_size = 32\n[model]\nname = "mlp"\n[model.options]\nhidden = [16]\n'
                      '[data]\nname = "digits"\n[optim]\nlr = 0.01\nlr_schedule = "cosine"\n')
    args = build_parser().parse_args(["train", "--config", str(config), "--epochs", "2", "--lr", "0.5"])
    cfg = config_from_args(args)
    assert (cfg.epochs, cfg.batch_size, cfg.optim.lr, cfg.optim.lr_schedule) == (2, 32, 0.5, "cosine")
    assert cfg.model.options == {"hidden": [16]}


def test_predict_offers_the_layout_flags_and_none_that_only_training_reads():
    parser = build_parser(only="predict").command_parsers["predict"]
    flags = {flag for action in parser._actions for flag in action.option_strings}
    assert {"--nproc", "--strategy", "--stages", "--tensor-parallel", "--num-ps", "--device"} <= flags
    assert not flags & {"--grad-compression", "--powersgd-rank", "--sync-batchnorm", "--bucket-cap-mb", "--ps-mode",
                        "--backup-workers", "--stale-lr"}
    train = build_parser(only="train").command_parsers["train"]
    assert "--grad-compression" in {flag for action in train._actions for flag in action.option_strings}


def test_no_arguments_means_the_default_recipe():
    cfg = config_from_args(build_parser().parse_args(["train"]))
    assert (cfg.model.name, cfg.data.name, cfg.target, cfg.target_metric) == ("cnn1d", "mnist1d", 0.94, "accuracy")


def test_target_accuracy_flag_is_a_target_on_the_accuracy_metric():
    cfg = config_from_args(build_parser().parse_args(["train", "--target-accuracy", "0.5", "--target-metric", "loss"]))
    assert (cfg.target, cfg.target_metric) == (0.5, "accuracy")   # the flag names its metric
    cfg = config_from_args(build_parser().parse_args(["train", "--target", "3.5", "--target-metric", "perplexity"]))
    assert (cfg.target, cfg.target_metric) == (3.5, "perplexity")


def test_a_target_alone_on_other_data_means_its_tasks_metric_not_the_recipes():
    """`--target 0.8` on regression data is the task's default metric (r2), not the default recipe's
    accuracy (which the regression task would refuse); on the recipe's own data it stays the recipe's."""
    cfg = config_from_args(build_parser().parse_args(["train", "--data", "friedman1", "--target", "0.8"]))
    assert (cfg.target, cfg.target_metric) == (0.8, "auto")
    cfg = config_from_args(build_parser().parse_args(["train", "--target", "0.8"]))
    assert (cfg.target, cfg.target_metric) == (0.8, "accuracy")


def _bad_inputs(tmp_path):
    (tmp_path / "unknown.toml").write_text("epochs = 2\nlearning_rate = 0.1\n")
    (tmp_path / "nested.toml").write_text("[optim]\nlearning_rate = 0.1\n")
    (tmp_path / "type.toml").write_text('epochs = "ten"\n')
    (tmp_path / "broken.toml").write_text("epochs = = 2\n")
    folder = make_idx_folder(tmp_path / "idx")
    magic = make_idx_folder(tmp_path / "magic")
    write_idx(magic / "t10k-images-idx3-ubyte.gz", np.zeros((16, 28, 28)), 2049, gz=True)
    short = make_idx_folder(tmp_path / "short", gz=False)
    write_idx(short / "train-labels-idx1-ubyte", np.zeros(64), 2049, cut=10)
    labels = make_idx_folder(tmp_path / "labels")
    write_idx(labels / "t10k-labels-idx1-ubyte.gz", np.full(16, 99), 2049, gz=True)
    shape = make_idx_folder(tmp_path / "shape")
    write_idx(shape / "t10k-images-idx3-ubyte.gz", np.zeros((16, 28, 27)), 2051, gz=True)
    fashion = ["--data", "fashion-mnist", "--model", "mlp", "--epochs", "1"]
    digits = ["--model", "mlp", "--data", "digits"]
    return [
        (["--config", str(tmp_path / "unknown.toml")], "unknown config key 'learning_rate'"),
        (["--config", str(tmp_path / "nested.toml")], "unknown config key 'optim.learning_rate'"),
        (["--config", str(tmp_path / "type.toml")], "config key 'epochs' expects int, got str"),
        (["--config", str(tmp_path / "broken.toml")], "is not valid TOML"),
        (["--config", str(tmp_path / "absent.toml")], "absent.toml does not exist"),
        (fashion + ["--data-dir", str(tmp_path / "nowhere")], "data folder not found"),
        (fashion + ["--data-dir", str(magic)], "t10k-images-idx3-ubyte.gz: wrong magic number 2049"),
        (fashion + ["--data-dir", str(short)], "train-labels-idx1-ubyte: truncated file"),
        (fashion + ["--data-dir", str(labels)], "label 99 is out of range [0, 10)"),
        (fashion + ["--data-dir", str(shape)], "shape mismatch"),
        (fashion + ["--data-dir", str(folder), "--model", "nope"], "unknown model 'nope'"),
        (["--model", "mlp", "--data", "digits", "--precision", "fp4"], "'precision.policy' must be one of auto, "
                                                                       "bf16-mixed, bf16-true, fp16-mixed, fp32, "
                                                                       "fp32-strict, fp8, tf32"),
        (["--model", "mlp", "--data", "digits", "--batch-size", "30", "--grad-accum-steps", "4"],
         "global batch 30 does not divide across 1 replica(s) x 4 accumulation steps; use --batch-size 28 or 32"),
        (["--model", "mlp", "--data", "digits", "--epochs", "0"], "config key 'epochs' must be >= 1"),
        (["--model", "mlp", "--data", "digits", "--fp32-modules", "nothing"], "matches no module"),
        (["--model", "wrn-16-10", "--data", "mnist1d"], "needs image samples"),
        (["--model", "mlp", "--data", "digits", "--strategy", "zero9"], "'distributed.strategy' must be one of auto, "
                                                                        "ddp, fsdp"),
        (["--model", "mlp", "--data", "digits", "--resume", str(tmp_path / "nope")], "no such checkpoint folder"),
        (["--model", "mlp", "--data", "digits", "--grad-compression", "int4"],
         "'distributed.grad_compression' must be one of none, bf16, fp16"),
        (["--model", "mlp", "--data", "digits", "--nproc", "0"], "'distributed.nproc' must be >= 1"),
        (["--model", "mlp", "--data", "digits", "--powersgd-rank", "4"],
         "--powersgd-rank and --powersgd-warmup need --grad-compression powersgd"),
        (["--model", "mlp", "--data", "digits", "--grad-compression", "powersgd", "--powersgd-warmup", "1"],
         "'distributed.powersgd_warmup' must be >= 2"),
        (["--model", "mlp", "--data", "digits", "--nproc", "2", "--strategy", "fsdp", "--grad-compression", "powersgd"],
         "--grad-compression powersgd does not apply to --strategy fsdp"),
        (["--model", "mlp", "--data", "digits", "--devices", "0,1"], "names 2 devices for one process"),
        (["--model", "mlp", "--data", "digits", "--devices", "0,-1", "--nproc", "2"],
         "'distributed.devices' has an item that must be >= 0"),
        (["--model", "mlp", "--data", "shards", "--data-dir", "http://127.0.0.1:9/s", "--fetch-timeout-s", "0"],
         "'data.fetch_timeout_s' must be > 0"),
        (["--model", "mlp", "--data", "digits", "--nproc", "2", "--strategy", "single"],
         "--strategy single cannot run on 2 processes"),
        (["--model", "no_such_module:build", "--data", "digits"], "cannot import module 'no_such_module'"),
        # Values out of range: each declared beside its field (config.py), all caught the same way.
        (digits + ["--clip-grad-norm", "-1"], "'optim.clip_grad_norm' must be > 0"),
        (digits + ["--val-batch-size", "-1"], "'data.val_batch_size' must be >= 1"),
        (digits + ["--num-workers", "-1"], "'data.num_workers' must be >= 0"),
        (digits + ["--momentum", "-5"], "'optim.momentum' must be >= 0 and < 1"),
        (digits + ["--early-stopping-patience", "0"], "'early_stopping_patience' must be >= 1"),
        (digits + ["--lr", "nan"], "'optim.lr' must be a finite number"),
        (digits + ["--warmup-epochs", "-0.5"], "'optim.warmup_epochs' must be >= 0"),
        (digits + ["--step-milestones", "5,-1"], "'optim.step_milestones' has an item that must be >= 0"),
        (digits + ["--device", "gpu"], "'device' must be auto, cpu, cuda, cuda:N or xla"),
        # XLA devices need torch_xla, which this environment never has (.venv-xla has: tests/xla/).
        (digits + ["--device", "xla"], "--device xla needs torch_xla, which this environment does not have; "
                                      "bash scripts/setup.sh xla"),
        (digits + ["--strategy", "spmd"], "--strategy spmd runs on xla devices only; use --device xla"),
        (digits + ["--run-id", "a b/c"], "'tracking.run_id' must be 1-64 letters"),
        (digits + ["--compile-mode", "fastest"], "'compile_mode' must be one of default"),
        (digits + ["--augment", "rotate"], "'data.augment' has an item that must be one of shift, flip"),
        (digits + ["--logger", "neptune"], "'tracking.loggers' has an item that must be one of mlflow, wandb, "
                                           "tensorboard"),
        (digits + ["--inter-op-threads", "0"], "'inter_op_threads' must be >= 1"),
        # Data that cannot train.
        (npz_data(tmp_path, "empty", x=np.zeros((0, 4)), y=np.zeros(0, dtype=np.int64)), "x holds no samples"),
        (npz_data(tmp_path, "sparse", x=np.zeros((8, 4)), y=np.array([0, 1] * 3 + [10**9, 5])),
         "labels go up to 1000000000 but only 4 distinct values occur"),
        (npz_data(tmp_path, "nan", x=np.where(np.arange(32).reshape(8, 4) % 7 == 0, np.nan, 1.0), y=np.arange(8) % 2),
         "[x]: 5 feature value(s) are inf or NaN"),
        # Outputs that cannot be written: caught before any data is loaded or any step runs.
        (digits + ["--summary-json", str(tmp_path)], "--summary-json " + str(tmp_path) + " is a folder"),
        (digits + ["--summary-json", str(tmp_path / "unknown.toml" / "s.json")], "unknown.toml is a file"),
        (digits + ["--store", str(tmp_path / "unknown.toml" / "runs.db")], "unknown.toml is a file"),
        # The OS's reason for the path tried (/proc exists: making a folder in it is what fails).
        (digits + ["--summary-json", "/proc/nope/s.json"],
         "--summary-json folder /proc/nope cannot be written (creating /proc/nope: No such file or directory)"),
    ]


def npz_data(tmp_path, name, **arrays):
    np.savez(tmp_path / f"{name}.npz", **arrays)
    return ["--data", "npz", "--data-dir", str(tmp_path / f"{name}.npz"), "--model", "mlp"]


def test_each_bad_input_gives_one_clear_line_and_exit_2(tmp_path, capsys):
    for argv, message in _bad_inputs(tmp_path):
        code = main(["train", "--no-progress", "--run-dir", str(tmp_path / "r"), *argv])
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert message in err, (argv, err)
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert not (tmp_path / "r").exists(), f"{argv} left a run folder behind"


@pytest.mark.usefixtures("processes")
def test_bad_input_through_the_real_console_entry_point(tmp_path):
    result = run_cli("train", "--data", "fashion-mnist", "--data-dir", str(tmp_path / "missing"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("scaletrain: error:") and "Traceback" not in result.stderr
    result = run_cli("train", "--epochs", "many", cwd=tmp_path)
    assert result.returncode == 2 and "invalid int value: 'many'" in result.stderr


def test_the_planners_answer_not_modelled_for_xla_in_one_line_rather_than_a_figure(tmp_path, capsys):
    for command in ("plan-memory", "scaling", "find-batch-size"):
        code = main([command, "--device", "xla", "--model", "mlp", "--data", "digits"])
        err = capsys.readouterr().err
        assert code == 2 and f"{command}: not modelled for XLA devices" in err, err
        assert err.count("\n") == 1 and "Traceback" not in err, err


def test_a_command_line_argparse_refuses_is_one_line_naming_the_help_to_read(capsys):
    cases = [
        (["scaling", "--network", "1g"], "argument --network: invalid choice: '1g'", "scaletrain scaling --help"),
        (["train", "--no-such-flag"], "unrecognized arguments: --no-such-flag", "scaletrain train --help"),
        (["runs"], "the following arguments are required: COMMAND", "scaletrain runs --help"),
        (["runs", "show"], "required: run_id", "scaletrain runs show --help"),
        (["no-such-command"], "invalid choice: 'no-such-command'", "scaletrain --help"),
    ]
    for argv, message, help_line in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("scaletrain: error: ") and message in err and f"`{help_line}`" in err, (argv, err)
        assert err.count("\n") == 1 and "usage:" not in err, err


def test_model_option_flag_is_read_as_toml():
    args = build_parser().parse_args(["train", "--model", "mlp", "--model-option", "hidden=[32, 16]",
                                      "--model-option", "dropout=0.1"])
    cfg = config_from_args(args)
    assert cfg.model.options == {"hidden": [32, 16], "dropout": 0.1}
