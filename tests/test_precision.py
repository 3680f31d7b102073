import numpy as np
import pytest
import torch

from scaletrain.config import OptimConfig, PrecisionConfig
from scaletrain.errors import ConfigError, NonFiniteLossError
from scaletrain.precision import POLICIES, get_policy
from scaletrain.training import Trainer
from tests.conftest import small_config
from tests.helpers import Poison, PoisonAt, fit, make_mlp


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_trains(tmp_path, digits, policy):
    # (fp8 emulated: this CPU has no float8 tensor cores; precision/float8.py)
    cfg = small_config(tmp_path, epochs=4, precision=PrecisionConfig(policy=policy, fp8_emulate=policy == "fp8"))
    history = fit(cfg, digits).history
    assert history[-1]["train_loss"] < 0.6 * history[0]["train_loss"]
    assert history[-1]["val_accuracy"] > history[0]["val_accuracy"]
    assert history[-1]["val_accuracy"] > 0.85


def test_bf16_true_stores_bf16_weights_and_mixed_keeps_fp32(tmp_path, digits):
    true = Trainer(make_mlp(digits), small_config(tmp_path, precision=PrecisionConfig(policy="bf16-true")))
    mixed = Trainer(make_mlp(digits), small_config(tmp_path, precision=PrecisionConfig(policy="bf16-mixed")))
    assert all(p.dtype == torch.bfloat16 for p in true.model.parameters())
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())


def test_fp16_overflow_step_is_skipped_weights_untouched_schedule_paused(tmp_path, digits):
    cfg = small_config(tmp_path, epochs=1, precision=PrecisionConfig(policy="fp16-mixed", init_scale=1024.0),
                       optim=OptimConfig(lr=3e-3, lr_schedule="cosine"))
    model = Poison(make_mlp(digits))
    poison = PoisonAt(model, step=5)
    trainer = fit(cfg, digits, [poison], model=model)
    bad, good = poison.records[5], poison.records[6]
    for name, tensor in bad["before"].items():
        assert torch.equal(tensor, bad["after"][name]), f"{name} changed on a skipped step"
    assert any(not torch.equal(t, good["after"][n]) for n, t in good["before"].items())
    assert bad["applied_after"] == bad["applied_before"]          # the schedule did not advance
    assert good["applied_after"] == good["applied_before"] + 1
    assert bad["lr"] == good["lr"]                                 # so the next step reused its LR
    summary_logs = trainer.history[-1]
    assert summary_logs["skipped_steps"] == 1
    assert summary_logs["optimizer_steps"] == trainer.steps_per_epoch - 1
    assert summary_logs["loss_scale"] == 512.0                     # backed off once from 1024


def test_fp16_loss_scale_backs_off_then_grows_back(tmp_path, digits):
    cfg = small_config(tmp_path, epochs=1, precision=PrecisionConfig(policy="fp16-mixed", init_scale=256.0,
                                                                      growth_interval=5))
    model = Poison(make_mlp(digits))
    trainer = fit(cfg, digits, [PoisonAt(model, step=2)], model=model)
    # 20 steps (1,294 training samples, batch 64): halved to 128 at step 2, then doubled after
    # every 5 clean steps: steps 3..19 are 17 clean steps, so 3 doublings.
    assert trainer.steps_per_epoch == 20
    assert trainer.history[-1]["loss_scale"] == 128.0 * 2**3


@pytest.mark.parametrize("policy", ["fp32", "bf16-mixed"])
def test_nonfinite_loss_stops_with_the_step_named(tmp_path, digits, policy):
    cfg = small_config(tmp_path, epochs=1, log_every=1, precision=PrecisionConfig(policy=policy))
    model = Poison(make_mlp(digits))
    with pytest.raises(NonFiniteLossError, match="training step 4 "):
        fit(cfg, digits, [PoisonAt(model, step=3)], model=model)


def _record_dtypes(model):
    seen = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, (i[0].dtype, o.dtype)))
    return seen


def test_fp32_opt_out_by_name_runs_in_float32_under_autocast(tmp_path, digits):
    cfg = small_config(tmp_path, epochs=1, precision=PrecisionConfig(policy="bf16-mixed", fp32_modules=["head"]))
    model = make_mlp(digits)
    seen = _record_dtypes(model)
    fit(cfg, digits, model=model)
    # Under bf16 autocast a Linear returns bf16; a float32 output means it computed in float32.
    assert seen["head"][1] == torch.float32
    assert seen["body.1"][1] == torch.bfloat16  # the rest still runs in bf16


def test_fp32_opt_out_by_class_under_bf16_true(tmp_path, digits):
    cfg = small_config(tmp_path, epochs=2, precision=PrecisionConfig(policy="bf16-true", fp32_modules=["Linear"]))
    model = make_mlp(digits)
    seen = _record_dtypes(model)
    trainer = fit(cfg, digits, model=model)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    # float32 weights with bf16 inputs would raise a dtype error: the island casts its inputs up,
    # computes in float32 and hands bf16 back to the next (bf16) layer.
    assert all(out == torch.bfloat16 for _, out in seen.values())
    assert trainer.history[-1]["val_accuracy"] > 0.8


def test_fp32_opt_out_unknown_name_is_a_clear_error(digits):
    with pytest.raises(ConfigError, match="matches no module"):
        get_policy("bf16-mixed").convert_module(make_mlp(digits), ["nope"])


def test_unknown_policy():
    with pytest.raises(ConfigError, match="unknown precision 'fp4'"):
        get_policy("fp4")


def test_float64_numpy_input_is_converted_to_float32(tmp_path, digits):
    trainer = fit(small_config(tmp_path, epochs=1), digits)
    x = digits.test.x.numpy().astype(np.float64)
    probs = trainer.predict(x)
    assert probs.dtype == torch.float32 and probs.shape == (len(x), 10)
    assert torch.allclose(probs.sum(1), torch.ones(len(x)), atol=1e-5)
    acc = (probs.argmax(1) == digits.test.y).float().mean().item()
    assert abs(acc - trainer.test_logs["test_accuracy"]) < 1e-6
