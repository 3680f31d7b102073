import io
import json
import re
import statistics

import pytest
import torch
from rich.console import Console

from scaletrain.callbacks import MetricsLog, ProgressBar, Throughput, TotalTime
from scaletrain.config import PrecisionConfig
from tests.conftest import small_config
from tests.helpers import fit, weights


def test_reporting_callbacks_in_a_real_run(tmp_path, digits):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    meter, total = Throughput(console), TotalTime(console)
    log = MetricsLog(tmp_path / "m.jsonl")
    trainer = fit(small_config(tmp_path, epochs=3, log_every=5), digits,
                  [meter, total, log, ProgressBar(console, show_bar=True)])
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue())  # drop terminal styling
    assert "Epoch 1:" in text and "(warm-up epoch)" in text and "Epoch 2:" in text
    assert text.count("(warm-up epoch)") == 1
    assert "Cumulative training time after epoch 3" in text and "Cumulative training time:" in text
    assert len(meter.per_epoch) == 3
    assert total.after_epoch == sorted(total.after_epoch) and total.after_epoch[-1] == pytest.approx(
        trainer.clock.total)
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert {"train_loss", "val_accuracy", "images_per_sec", "cumulative_train_time_s"} <= set(records[0])
    # Images/sec is each epoch's samples over its training clock, and the steady state is the median
    # of the epochs after the warm-up one (a figure taken from epoch 1, or from wall time, fails).
    per_epoch = [r["samples"] / r["epoch_train_time_s"] for r in records]
    assert [r["images_per_sec"] for r in records] == pytest.approx(per_epoch)
    assert meter.steady_state() == pytest.approx(statistics.median(per_epoch[1:]))
    assert records[0]["warmup_epoch"] and not records[1]["warmup_epoch"]
    # Evaluation is not training time: the clock total is the sum of the epochs' training loops.
    assert trainer.clock.total == pytest.approx(sum(r["epoch_train_time_s"] for r in records))
    assert trainer.eval_time_s == pytest.approx(sum(r["eval_time_s"] for r in records))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_fused_steps_equal_unfused_on_each_device(tmp_path, digits, device):
    """On CUDA, steps_per_execution > 1 replays a captured CUDA graph of the whole step."""
    class Executions:   # how often the host got control back: once per execution of steps
        calls = 0

        def on_train_batch_end(self, trainer, step, logs):
            self.calls += 1
    base = dict(epochs=2, device=device, precision=PrecisionConfig(policy="bf16-mixed"))
    a = fit(small_config(tmp_path, steps_per_execution=1, **base), digits, callbacks=[unfused := Executions()])
    b = fit(small_config(tmp_path, steps_per_execution=4, **base), digits, callbacks=[fused := Executions()])
    assert b.use_graphs == (device == "cuda")
    steps = a.steps_per_epoch
    assert unfused.calls == 2 * steps and fused.calls == 2 * -(-steps // 4)   # 4 steps per round-trip
    assert b.history[-1]["optimizer_steps"] == a.history[-1]["optimizer_steps"] == 2 * steps
    wa, wb = weights(a.model), weights(b.model)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-4) for k in wa)
