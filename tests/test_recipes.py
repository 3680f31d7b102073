"""Real training to a target accuracy on 2 CPU cores."""

import json
import time

import pytest

from scaletrain.cli.main import main


@pytest.mark.slow
def test_default_recipe_reaches_94_percent_test_accuracy_on_mnist1d(tmp_path, capsys):
    """The recipe's promise is 94 % on the test split, on any machine: measured over seeds 0-9 under
    1 and 2 threads it read 97.4-98.3 % (BENCHMARKS.md), so the assertion keeps a 3-point margin
    for CPUs whose kernels sum in another order."""
    summary = tmp_path / "summary.json"
    start = time.perf_counter()
    # The default recipe, as `scaletrain train` runs it, with only the output places moved.
    code = main(["train", "--recipe", "mnist1d-cnn", "--run-dir", str(tmp_path / "run"),
                 "--summary-json", str(summary), "--no-progress"])
    elapsed = time.perf_counter() - start
    assert code == 0
    data = json.loads(summary.read_text())
    with capsys.disabled():
        print(f"\n[default recipe] MNIST-1D CNN: best validation accuracy {data['best_val_accuracy']:.4f} after "
              f"{data['epochs_run']} epochs, test accuracy {data['test_accuracy']:.4f}; time to 94 %: "
              f"{data['time_to_target_s']:.2f} s of training, {elapsed:.1f} s wall including data generation")
    assert data["reached_target"] is True and data["epochs_run"] == 6
    # The paper's figure, on the test split the run never selected on.
    assert data["test_accuracy"] >= 0.94


@pytest.mark.slow
def test_digits_mlp_reaches_97_percent(tmp_path):
    summary = tmp_path / "summary.json"
    code = main(["train", "--model", "mlp", "--data", "digits", "--epochs", "30", "--batch-size", "64",
                 "--lr", "0.003", "--lr-schedule", "cosine", "--weight-decay", "0.01",
                 "--target-accuracy", "0.97", "--patience", "2",
                 "--run-dir", str(tmp_path / "run"), "--summary-json", str(summary), "--no-progress"])
    assert code == 0
    data = json.loads(summary.read_text())
    assert data["best_val_accuracy"] >= 0.97 and data["reached_target"] is True


@pytest.mark.slow
def test_char_gpt_recipe_trains_its_gpt_on_the_offline_corpus(tmp_path):
    """The recipe itself, cut to 3,000 windows and one epoch (the full run to perplexity 4.5 takes
    about 80 s and is benchmarks/char_gpt.py's job)."""
    summary = tmp_path / "summary.json"
    code = main(["train", "--recipe", "char-gpt", "--train-subset", "3000", "--epochs", "1",
                 "--run-dir", str(tmp_path / "run"), "--summary-json", str(summary), "--no-progress", "--no-record"])
    assert code == 0
    data = json.loads(summary.read_text())
    assert (data["model"], data["task"], data["target_metric"]) == ("gpt-tiny", "language-model", "perplexity")
    assert data["val_metrics"]["perplexity"] < 25    # from 103 (a uniform guess) in 47 steps
