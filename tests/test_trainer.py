import math
import os

import pytest
import torch

from scaletrain.callbacks import EarlyStopping, StopAtTarget
from scaletrain.config import OptimConfig, PrecisionConfig
from scaletrain.data import DeviceLoader, StreamingLoader
from scaletrain.optim import LRSchedule, build_schedule, squared_norm
from scaletrain.training import Trainer
from tests.conftest import small_config
from tests.helpers import fit, make_mlp, weights
from tests.processes import children


class FakeTrainer:
    stop_training = False


def test_stop_at_accuracy_waits_for_patience_consecutive_epochs():
    stopper = StopAtTarget(target=0.85, patience=2, verbose=False)
    trainer = FakeTrainer()
    accs = [0.5, 0.9, 0.8, 0.9, 0.95, 0.99]
    for epoch, acc in enumerate(accs):
        stopper.on_epoch_end(trainer, epoch, {"val_accuracy": acc, "cumulative_train_time_s": 10.0 * (epoch + 1)})
        if trainer.stop_training:
            break
    assert stopper.stopped_epoch == 4           # 0.9 then 0.95: two in a row
    assert stopper.reached_epoch == 1           # first reached at epoch 2 ...
    assert stopper.time_to_target_s == 20.0     # ... after 20 s of training


def test_stop_at_accuracy_stops_a_real_run(tmp_path, digits):
    stopper = StopAtTarget(target=0.9, patience=2, verbose=False)
    trainer = fit(small_config(tmp_path, epochs=30), digits, [stopper])
    accs = [h["val_accuracy"] for h in trainer.history]
    assert len(trainer.history) < 30
    assert accs[-1] >= 0.9 and accs[-2] >= 0.9
    assert all(not (a >= 0.9 and b >= 0.9) for a, b in zip(accs[:-2], accs[1:-1], strict=True))


def test_early_stopping_on_stalled_loss():
    stopper, trainer = EarlyStopping(monitor="val_loss", patience=2), FakeTrainer()
    for epoch, loss in enumerate([1.0, 0.5, 0.6, 0.55]):
        stopper.on_epoch_end(trainer, epoch, {"val_loss": loss})
    assert trainer.stop_training and stopper.stopped_epoch == 3


def test_fused_steps_equal_unfused(tmp_path, digits):
    a = fit(small_config(tmp_path, epochs=2, steps_per_execution=1), digits)
    calls = []

    class Count:
        def on_train_batch_end(self, trainer, step, logs):
            calls.append(step)

    b = fit(small_config(tmp_path, epochs=2, steps_per_execution=4), digits, [Count()])
    wa, wb = weights(a.model), weights(b.model)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    assert calls[:3] == [4, 8, 12]  # callbacks run once per 4 fused steps
    assert a.history[-1]["val_accuracy"] == pytest.approx(b.history[-1]["val_accuracy"])


def test_gradient_accumulation_matches_one_big_batch(tmp_path, digits):
    a = fit(small_config(tmp_path, epochs=1), digits)
    cfg = small_config(tmp_path, epochs=1)
    cfg.optim.grad_accum_steps = 4
    b = fit(cfg, digits)
    wa, wb = weights(a.model), weights(b.model)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-5) for k in wa)


def test_warm_up_leaves_no_trace(tmp_path, digits):
    """The untimed warm-up runs real steps; the run must continue as if it had not."""
    cfg = small_config(tmp_path, epochs=1)
    trainer = Trainer(make_mlp(digits), cfg)
    before = weights(trainer.model)
    trainer.fit(digits)
    assert trainer.warmup_s > 0
    assert trainer.history[-1]["optimizer_steps"] == trainer.steps_per_epoch
    # A second trainer from the same weights, with no warm-up at all, gets bit-identical results:
    # whatever the warm-up's real steps changed (weights, optimizer state, counters, RNG) was put back.
    again = Trainer(make_mlp(digits), cfg)
    assert all(torch.equal(before[k], v) for k, v in weights(again.model).items())

    def no_warm_up(train_loader, val_loader):
        again._step = again.train_step
        return 0.0
    again._warm_up = no_warm_up
    again.fit(digits)
    assert again.warmup_s == 0.0
    w1, w2 = weights(trainer.model), weights(again.model)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


class _NoHostSync:
    """Makes every host read of a tensor raise, to prove a code path never synchronises."""

    NAMES = ("item", "tolist", "__bool__", "__float__", "__int__", "numpy", "cpu")

    def __enter__(self):
        self.saved = {n: getattr(torch.Tensor, n) for n in self.NAMES}
        for n in self.NAMES:
            def fail(*a, _n=n, **k):
                raise AssertionError(f"host sync: Tensor.{_n} called in the training step")
            setattr(torch.Tensor, n, fail)

    def __exit__(self, *exc):
        for n, fn in self.saved.items():
            setattr(torch.Tensor, n, fn)


def steps_without_host_syncs(trainer, x, y, steps: int = 3) -> None:
    """Runs `steps` training steps on the batch (x, y) with every host read of a tensor failing,
    then checks on the device counters that each of them ran (applied or skipped for overflow)."""
    trainer.counters.reset_epoch()
    trainer.counters.set_applied(0)
    with _NoHostSync():
        for _ in range(steps):
            trainer.train_step(x, y)
    counters = trainer.counters.tensors()
    assert int(counters["applied_steps"]) + int(counters["skipped"]) == steps
    assert int(counters["slot"]) == steps


@pytest.mark.parametrize("policy", ["fp32", "fp16-mixed"])
def test_training_step_has_no_host_sync(tmp_path, digits, policy):
    cfg = small_config(tmp_path, epochs=1, precision=PrecisionConfig(policy=policy),
                       optim=OptimConfig(lr=1e-3, lr_schedule="onecycle", clip_grad_norm=1.0))
    trainer = fit(cfg, digits)
    loader = trainer.loader(digits.train, train=True)
    x, y = next(iter(loader))
    steps_without_host_syncs(trainer, x, y)
    assert int(trainer.counters.tensors()["skipped"]) == 0


def test_step_schedule_matches_the_seed_lab():
    """Seed 003: base LR until epoch 15, x0.1 until 25, x0.01 until 35, then x0.001."""
    spe = 10
    cfg = OptimConfig(lr=0.01, lr_schedule="step", step_milestones=[15, 25, 35], step_gamma=0.1)
    schedule = build_schedule(cfg, steps_per_epoch=spe, epochs=40)

    def seed_lab(epoch):
        return 0.01 if epoch < 15 else 1e-3 if epoch < 25 else 1e-4 if epoch < 35 else 1e-5

    for epoch in range(40):
        assert schedule.value_at(epoch * spe + 3) == pytest.approx(seed_lab(epoch), rel=1e-5)


def test_cosine_with_warmup_and_onecycle_shapes():
    cos = LRSchedule(kind="cosine", base_lr=1.0, total_steps=110, warmup_steps=10)
    assert cos.value_at(0) == pytest.approx(0.1)
    assert cos.value_at(9) == pytest.approx(1.0)
    assert cos.value_at(60) == pytest.approx(0.5, abs=1e-6)
    assert cos.value_at(110) == pytest.approx(0.0, abs=1e-6)
    one = LRSchedule(kind="onecycle", base_lr=1.0, total_steps=100, warmup_steps=30)
    assert one.value_at(0) == pytest.approx(1 / 25)
    assert one.value_at(30) == pytest.approx(1.0)
    assert one.value_at(65) == pytest.approx(0.5, abs=1e-6)
    assert one.value_at(99) < 0.01


def test_lr_used_by_the_optimizer_follows_the_schedule(tmp_path, digits):
    cfg = small_config(tmp_path, epochs=2, optim=OptimConfig(lr=0.01, lr_schedule="cosine"))
    trainer = fit(cfg, digits)
    steps = trainer.steps_per_epoch
    expected = 0.01 * 0.5 * (1 + math.cos(math.pi * (steps - 1) / (2 * steps)))
    assert trainer.history[0]["lr"] == pytest.approx(expected, rel=1e-5)


def test_gradient_clipping_bounds_the_update(tmp_path, digits):
    cfg = small_config(tmp_path, epochs=1, optim=OptimConfig(optimizer="sgd", lr=1.0, momentum=0.0,
                                                             clip_grad_norm=1e-3))
    model = make_mlp(digits)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    trainer = Trainer(model, cfg)
    trainer.fit(digits)
    after = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    # Each SGD step moves the weights by lr * ||clipped grad|| <= 1e-3.
    assert (after - before).norm() <= 1e-3 * trainer.steps_per_epoch + 1e-6


def test_the_clip_norm_is_the_same_however_the_gradients_are_split():
    """One device sums every gradient's squared norm; pipeline stages sum their own and add the
    parts. The clip factor (float32) must come out bitwise equal either way, or a pipeline drifts
    from one device (it did on AVX2 CPUs with torch's float32 norm of norms)."""
    torch.manual_seed(0)
    grads = [torch.randn(n) * s for n, s in [(10_000, 1e-3), (33, 5.0), (4_097, 0.2), (1, 1e-6), (777, 3e-2)] * 8]
    whole = squared_norm(grads, torch.device("cpu"))
    assert whole.dtype == torch.float64
    assert whole.item() == pytest.approx(sum(g.double().square().sum().item() for g in grads), rel=1e-6)
    for cut in range(1, len(grads)):
        split = squared_norm(grads[:cut], torch.device("cpu")) + squared_norm(grads[cut:], torch.device("cpu"))
        assert (0.5 / (split.sqrt() + 1e-6)).float() == (0.5 / (whole.sqrt() + 1e-6)).float()
    assert squared_norm([], torch.device("cpu")).item() == 0.0


def test_evaluate_and_predict_agree(tmp_path, digits):
    trainer = fit(small_config(tmp_path, epochs=2), digits)
    result = trainer.evaluate(digits)
    assert result["accuracy"] == pytest.approx(trainer.test_logs["test_accuracy"])
    assert trainer.evaluate(digits, split="val")["accuracy"] == pytest.approx(trainer.history[-1]["val_accuracy"])
    assert result["accuracy"] != trainer.history[-1]["val_accuracy"]   # two different splits
    probs = trainer.predict(digits.test.x)
    assert (probs.argmax(1) == digits.test.y).float().mean().item() == pytest.approx(result["accuracy"])


def test_streaming_and_device_paths_train_identically(tmp_path, digits):
    a = fit(small_config(tmp_path, epochs=2), digits)
    cfg = small_config(tmp_path, epochs=2)
    cfg.data.placement = "stream"
    b = fit(cfg, digits)
    assert isinstance(b.loader(digits.train, train=True), StreamingLoader)
    assert isinstance(a.loader(digits.train, train=True), DeviceLoader)
    # Both see every sample per epoch, and on the CPU both draw the epoch's order from a CPU
    # generator with the same seed: the same batches, so the same weights and metrics.
    assert a.history[-1]["samples"] == b.history[-1]["samples"] == (len(digits.train) // 64) * 64
    wa, wb = weights(a.model), weights(b.model)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    assert a.history[-1]["val_loss"] == pytest.approx(b.history[-1]["val_loss"], rel=1e-5)


def test_streaming_with_worker_processes_trains_like_the_device_path(tmp_path, digits):
    """num_workers > 0: the DataLoader's workers and the one-batch-ahead copy keep the order. The
    workers end with the fit: left to the cycle collector they never got their stop, and each cost
    a 5 s join timeout later (a `--num-workers 2` run spent 30 s at exit)."""
    a = fit(small_config(tmp_path, epochs=2), digits)
    cfg = small_config(tmp_path, epochs=2)
    cfg.data.placement, cfg.data.num_workers = "stream", 2
    before = set(children(os.getpid()))
    b = fit(cfg, digits)
    assert set(children(os.getpid())) - before == set(), "the fit's DataLoader workers outlived it"
    wa, wb = weights(a.model), weights(b.model)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


@pytest.mark.slow
@pytest.mark.usefixtures("processes")   # torch.compile on a CPU starts Python to probe the vector ISA (once a process)
def test_compiled_run_matches_eager_and_reports_warmup(tmp_path, digits):
    eager = fit(small_config(tmp_path, epochs=1), digits)
    compiled = fit(small_config(tmp_path, epochs=1, compile=True), digits)
    assert compiled.warmup_s > eager.warmup_s
    we, wc = weights(eager.model), weights(compiled.model)
    assert all(torch.allclose(we[k], wc[k], atol=1e-4) for k in we)


def test_a_second_fit_continues_training_with_a_fresh_schedule(tmp_path, digits):
    cfg = small_config(tmp_path, epochs=1, optim=OptimConfig(lr=3e-3, lr_schedule="cosine"))
    trainer = fit(cfg, digits)
    first = trainer.history[-1]["val_accuracy"]
    trainer.fit(digits)
    assert len(trainer.history) == 2
    assert trainer.history[-1]["optimizer_steps"] == 2 * trainer.steps_per_epoch
    assert trainer.history[-1]["val_accuracy"] >= first - 0.02


def test_the_callers_config_is_theirs_after_the_trainer_settles_it(tmp_path, digits):
    """`cfg = TrainConfig(); Trainer(model, cfg)` once left cfg.precision.policy "fp32" where the user
    wrote "auto", and overwrote cfg.optim with a LightningModule's own: settling makes the trainer's
    own copy."""
    import copy

    from scaletrain.options import to_mapping
    cfg = small_config(tmp_path, epochs=1)
    cfg.precision = PrecisionConfig(policy="auto")
    before = copy.deepcopy(to_mapping(cfg))
    trainer = Trainer(make_mlp(digits), cfg)
    trainer.fit(digits)
    assert to_mapping(cfg) == before
    assert trainer.config.precision.policy != "auto" and cfg.precision.policy == "auto"
