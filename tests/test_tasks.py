"""Tasks: what is learned and how it is scored. Metric arithmetic against direct formulas, the
regression and language-model tasks trained end to end, and the target on any metric."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from scaletrain.callbacks import StopAtTarget
from scaletrain.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from scaletrain.data import load_dataset
from scaletrain.data.text import load_char_corpus
from scaletrain.errors import ConfigError
from scaletrain.tasks import TASKS, build_task
from scaletrain.tasks.classification import Classification
from scaletrain.tasks.language_model import LanguageModel
from scaletrain.tasks.regression import Regression
from scaletrain.training import build_training
from tests.processes import run


def _sums_in_parts(task, output, target, parts=3):
    return sum(task.eval_sums(o, t) for o, t in zip(output.chunk(parts), target.chunk(parts), strict=True)).tolist()


def test_regression_metrics_equal_their_formulas_when_summed_in_parts():
    torch.manual_seed(0)
    y = torch.randn(30)
    out = y[:, None] + 0.3 * torch.randn(30, 1)
    metrics = Regression().eval_metrics(_sums_in_parts(Regression(), out, y))
    err = out[:, 0].double() - y.double()
    r2 = 1 - (err ** 2).sum() / ((y.double() - y.double().mean()) ** 2).sum()
    assert metrics["loss"] == pytest.approx(float((err ** 2).mean()))
    assert metrics["mae"] == pytest.approx(float(err.abs().mean()))
    assert metrics["r2"] == pytest.approx(float(r2))
    assert Regression().loss(out, y) == pytest.approx(F.mse_loss(out[:, 0], y).item())


def test_language_model_metrics_count_every_token_once():
    torch.manual_seed(0)
    logits, tokens = torch.randn(6, 5, 11), torch.randint(0, 11, (6, 5))
    metrics = LanguageModel().eval_metrics(_sums_in_parts(LanguageModel(), logits, tokens))
    token_loss = F.cross_entropy(logits.reshape(-1, 11), tokens.reshape(-1))
    assert metrics["loss"] == pytest.approx(token_loss.item(), rel=1e-6)
    assert metrics["perplexity"] == pytest.approx(math.exp(token_loss.item()), rel=1e-6)
    assert metrics["accuracy"] == pytest.approx((logits.argmax(-1) == tokens).float().mean().item())


def test_classification_metrics_match_the_old_hard_coded_ones():
    torch.manual_seed(0)
    logits, labels = torch.randn(20, 4), torch.randint(0, 4, (20,))
    metrics = Classification().eval_metrics(_sums_in_parts(Classification(), logits, labels))
    assert metrics["loss"] == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-6)
    assert metrics["accuracy"] == pytest.approx((logits.argmax(-1) == labels).float().mean().item())


def test_a_task_is_refused_for_data_of_another_and_names_the_fix():
    assert build_task("auto", "regression").name == "regression"
    with pytest.raises(ConfigError, match="--task classification does not fit the data.*regression"):
        build_task("classification", "regression")
    with pytest.raises(ConfigError, match="the regression task reports loss, mae, r2"):
        build_task("auto", "regression").check_metric("accuracy")
    assert set(TASKS) == {"classification", "regression", "language-model", "own-loss"}


def test_a_task_says_whether_it_scores_a_mean_of_predictions():
    """What ensemble asks before predicting: every registered task can score predictions but the
    model's own loss; a user's task that overrides `predictions` must also invert them."""
    from scaletrain.tasks.base import Task
    assert [name for name in TASKS if TASKS.get(name).scores_predictions()] == ["own-loss"]

    class Sigmoid(Classification):
        def predictions(self, output):
            return torch.sigmoid(output.float())
    assert "not output_of_predictions" in Sigmoid.scores_predictions()
    Sigmoid.output_of_predictions = lambda self, p: torch.logit(p)
    assert Sigmoid.scores_predictions() == "" and Task.scores_predictions() == ""


def test_own_loss_on_a_model_without_labels_names_the_model():
    """Checked before anything is built, on the meta device's model: its class, not NoneType."""
    from scaletrain.training.preflight import run_task
    cfg = TrainConfig(model=ModelConfig(name="mlp"), data=DataConfig(name="digits"), task="own-loss")
    with pytest.raises(ConfigError, match="--task own-loss: MLP's forward takes no labels="):
        run_task(cfg)


def test_stop_at_target_stops_at_or_below_a_lower_is_better_metric():
    class Loop:
        stop_training = False
    stopper, loop = StopAtTarget(3.0, monitor="val_perplexity", higher_is_better=False, verbose=False), Loop()
    for epoch, ppl in enumerate([5.0, 3.2, 2.9]):
        stopper.on_epoch_end(loop, epoch, {"val_perplexity": ppl, "cumulative_train_time_s": epoch + 1.0})
    assert loop.stop_training and stopper.reached_epoch == 2 and stopper.time_to_target_s == 3.0


def test_char_corpus_targets_are_the_inputs_shifted_by_one_and_splits_do_not_overlap():
    ds = load_char_corpus(seq_len=16, text="abcdefghij" * 200)
    assert ds.task == "language-model" and ds.num_classes == 10 and ds.mean is None
    assert torch.equal(ds.train.x[0, 1:], ds.train.y[0, :-1])
    assert torch.equal(ds.train.x[1, :8], ds.train.x[0, 8:])     # training windows overlap by half
    assert len(ds.val) == (2000 * 0.05 - 1) // 16 and ds.train.x.dtype == torch.int64


def test_regression_trains_to_a_high_r2_and_reports_it_on_test(tmp_path):
    cfg = TrainConfig(model=ModelConfig(name="mlp", options={"hidden": [64, 64]}), data=DataConfig(name="friedman1"),
                      optim=OptimConfig(lr=3e-3), epochs=15, batch_size=64, progress=False, device="cpu",
                      target=0.8, target_metric="r2")
    with build_training(cfg) as built:
        assert built.trainer.task.name == "regression"
        built.trainer.fit(built.dataset)
        history, test = built.trainer.history, built.trainer.test_logs
    assert {"val_r2", "val_mae", "val_loss", "train_mae"} <= set(history[-1])
    assert history[-1]["val_r2"] >= 0.8 and test["test_r2"] > 0.75
    # The loss is the MSE of standardised targets: 1 - R^2 up to the split's spread.
    assert history[0]["val_loss"] > history[-1]["val_loss"]


@pytest.mark.usefixtures("processes")
@pytest.mark.slow
def test_char_gpt_cli_run_learns_and_stops_at_a_perplexity_target(tmp_path):
    result = run(["train", "--data", "char-corpus", "--model", "gpt", "--model-option", "dim=64",
                  "--model-option", "depth=2", "--model-option", "heads=2", "--seq-len", "32",
                  "--train-subset", "8000", "--batch-size", "64", "--epochs", "6", "--lr", "3e-3",
                  "--target", "12", "--target-metric", "perplexity", "--patience", "1",  # stop there (the
                  "--no-progress", "--no-record",     # default recipe only times its own target)
                  "--summary-json", "s.json", "--run-dir", "r"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["task"] == "language-model" and summary["target_metric"] == "perplexity"
    # A uniform guess over the ~100 characters is perplexity ~100; the target is 12.
    assert summary["reached_target"] and summary["val_metrics"]["perplexity"] <= 12
    assert summary["epochs_run"] < 6   # it stopped at the target
    assert summary["test_metrics"]["perplexity"] < 20
    assert "val perplexity <= 12" in result.stdout


@pytest.mark.usefixtures("processes")
def test_a_target_on_a_metric_the_task_lacks_is_one_line_before_any_file(tmp_path):
    result = run(["train", "--data", "friedman1", "--model", "mlp", "--epochs", "1", "--no-progress",
                  "--target-accuracy", "0.9", "--run-dir", "r"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("scaletrain: error: --target-metric accuracy: the "
                                                             "regression task reports loss, mae, r2")
    assert "Traceback" not in result.stderr and not (tmp_path / "r").exists()


@pytest.mark.usefixtures("processes")
def test_planner_and_batch_finder_work_for_a_language_model(tmp_path):
    plan = run(["plan-memory", "--data", "char-corpus", "--model", "gpt-tiny", "--batch-size", "16",
                "--strategy", "ddp,fsdp", "--devices", "2", "--json"], tmp_path)
    assert plan.returncode == 0, plan.stderr
    ddp, fsdp = json.loads(plan.stdout)
    assert ddp["activation_bytes"] > 0 and fsdp["param_bytes"] < ddp["param_bytes"]
    found = run(["find-batch-size", "--data", "char-corpus", "--model", "gpt", "--model-option", "dim=32",
                 "--model-option", "depth=1", "--model-option", "heads=2", "--seq-len", "16",
                 "--memory-limit", "10MB", "--max-batch-size", "512", "--json", "--no-progress"], tmp_path)
    assert found.returncode == 0, found.stderr
    result = json.loads(found.stdout)
    fits = {t["batch_size"]: t["fits"] for t in result["trials"]}
    # Token logits dominate: memory grows with the batch until the budget stops the search.
    assert 64 < result["max_batch_size"] < 512 and not fits[result["max_batch_size"] + 1]


def test_data_sets_name_their_task():
    assert load_dataset(DataConfig(name="friedman1")).task == "regression"
    assert load_dataset(DataConfig(name="digits")).task == "classification"


def test_the_readme_regression_line_reports_the_tasks_own_metrics_each_epoch(tmp_path, capsys):
    """README: `scaletrain train --data friedman1 --model mlp --target 0.9 --target-metric r2` (two
    epochs here). The per-epoch line once assumed classification and crashed after epoch 1."""
    from scaletrain.cli.main import main
    code = main(["train", "--data", "friedman1", "--model", "mlp", "--target", "0.9", "--target-metric", "r2",
                 "--epochs", "2", "--run-dir", str(tmp_path / "run"),
                 "--store", str(tmp_path / "runs.db")])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert code == 0
    epoch_lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(epoch_lines) == 2 and all("mae " in line and "val_r2 " in line for line in epoch_lines)
    assert not any("acc" in line for line in epoch_lines)
