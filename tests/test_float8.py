"""`--precision fp8` (precision/float8.py), emulated on this CPU: refused where it cannot run, in
one line; the linear layers it converts and the ones it names; the small GPT trains in it as in
bf16-mixed; a resume is exact; and its checkpoints are a bf16 run's, both ways."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from scaletrain.config import PrecisionConfig
from scaletrain.precision import float8, get_policy

EMULATED = PrecisionConfig(policy="fp8", fp8_emulate=True)


def test_fp8_is_refused_where_it_cannot_run_and_without_torchao(monkeypatch):
    policy = get_policy("fp8")
    named = PrecisionConfig(policy="fp8")
    cpu = policy.problem(named, "cpu", None)
    assert "compute capability 8.9 or newer" in cpu and "--fp8-emulate" in cpu
    assert "this GPU is 8.0" in policy.problem(named, "cuda", (8, 0))
    assert policy.problem(named, "cuda", (9, 0)) is None and policy.problem(named, "cuda", None) is None
    assert policy.problem(EMULATED, "cpu", None) is None
    monkeypatch.setattr(float8, "torchao_installed", lambda: False)
    assert policy.problem(EMULATED, "cpu", None) == float8.MISSING and "scaletrain[fp8]" in float8.MISSING


def test_linear_layers_divisible_by_16_train_in_float8_and_the_others_are_named():
    from torchao.float8.float8_linear import Float8Linear
    policy = get_policy("fp8")
    plain = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    keys = set(plain.state_dict())
    model = policy.convert_module(plain, ["2"], options=PrecisionConfig(policy="fp8", fp8_emulate=True,
                                                                          fp32_modules=["2"]))
    assert [isinstance(model[i], Float8Linear) for i in (0, 2, 4)] == [True, False, False]
    note, emulated = policy.notes(model, PrecisionConfig(policy="fp8", fp8_emulate=True, fp32_modules=["2"]))
    assert note == ("fp8 (tensorwise): 1 linear layer(s) in float8, the rest in bf16 autocast; kept out: "
                    "2 (kept in float32 (--fp32-modules)), 4 (64x10: not divisible by 16)")
    assert "emulated" in emulated and "not faster" in emulated
    # No float8-only state: the parameters, and so a checkpoint, are the plain model's.
    assert set(model.state_dict()) == keys
    x = torch.randn(8, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x).float().sum().backward()
    assert model[0].weight.grad is not None and model[0].weight.dtype == torch.float32


GPT = ["--model", "gpt", "--model-option", "dim=64", "--model-option", "depth=2", "--model-option", "heads=4",
       "--data", "char-corpus", "--seq-len", "32", "--train-subset", "1600", "--batch-size", "16",
       "--optimizer", "adamw", "--lr", "0.003", "--lr-schedule", "constant", "--checkpoint-every", "100",
       "--threads", "1", "--no-compile", "--no-progress"]


def _summary(folder) -> dict:
    return json.loads((folder / "summary.json").read_text())


def _weights(folder) -> dict:
    return torch.load(folder / "model.pt", map_location="cpu", weights_only=True)


@pytest.mark.usefixtures("processes")
def test_the_small_gpt_trains_in_fp8_as_in_bf16_mixed_resumes_exactly_and_loads_both_ways(tmp_path):
    from tests.processes import run
    refused = run(["train", *GPT, "--epochs", "1", "--precision", "fp8", "--run-dir", "x"], tmp_path)
    assert refused.returncode == 2 and "--fp8-emulate runs it emulated here" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "x").exists()
    fp8 = ["--precision", "fp8", "--fp8-emulate"]
    done = run(["train", *GPT, "--epochs", "3", *fp8, "--run-dir", "a"], tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "note: fp8 (tensorwise): 8 linear layer(s) in float8" in done.stdout and "not faster" in done.stdout
    bf16 = run(["train", *GPT, "--epochs", "3", "--precision", "bf16-mixed", "--run-dir", "b"], tmp_path)
    assert bf16.returncode == 0, bf16.stderr[-2000:]
    # 300 steps: the test loss within 5 % of bf16-mixed's (autotune's tolerance for 16-bit
    # arithmetic; measured on a 2-core EPYC: 2.575 against 2.580, 0.17 %).
    a, b = _summary(tmp_path / "a"), _summary(tmp_path / "b")
    assert a["optimizer_steps"] == b["optimizer_steps"] == 300
    assert abs(a["test_loss"] - b["test_loss"]) <= 0.05 * b["test_loss"], (a["test_loss"], b["test_loss"])
    # A resume is exact: 2 epochs, then on to 3 (a constant LR: the schedule does not depend on
    # the epochs asked for), give the 3-epoch run's weights bitwise.
    first = run(["train", *GPT, "--epochs", "2", *fp8, "--run-dir", "c"], tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = run(["train", *GPT, "--epochs", "3", *fp8, "--run-dir", "c", "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    wa, wc = _weights(tmp_path / "a"), _weights(tmp_path / "c")
    assert all(torch.equal(wa[k], wc[k]) for k in wa)
    # Both ways: the fp8 run's weights start a bf16-mixed run, and the bf16 run's an fp8 run.
    assert set(wa) == set(_weights(tmp_path / "b"))
    on = run(["train", *GPT, "--epochs", "1", "--precision", "bf16-mixed", "--init-from", str(tmp_path / "a" / "model.pt"),
              "--run-dir", "d"], tmp_path)
    back = run(["train", *GPT, "--epochs", "1", *fp8, "--init-from", str(tmp_path / "b" / "model.pt"), "--run-dir", "e"],
               tmp_path)
    assert on.returncode == 0 and back.returncode == 0, on.stderr[-2000:] + back.stderr[-2000:]


def test_fp8_is_a_candidate_of_the_probe_on_float8_tensor_cores_only():
    from scaletrain.precision.hardware import CPU_BF16_FLAGS, DeviceFacts
    from scaletrain.training.probe import precision_candidates
    h100 = DeviceFacts("cuda", "NVIDIA H100", (9, 0))
    assert precision_candidates(h100, "bf16-mixed") == ["fp32", "fp16-mixed", "fp8"]
    assert "fp8" not in precision_candidates(DeviceFacts("cuda", "NVIDIA A100", (8, 0)), "bf16-mixed")
    cpu = DeviceFacts("cpu", "a CPU", None, cpu_flags=frozenset(CPU_BF16_FLAGS))
    assert "fp8" not in precision_candidates(cpu, "fp32")


def test_the_memory_planner_drops_the_bf16_weight_copy_of_each_layer_fp8_converts():
    """bf16-mixed keeps a bf16 copy of each linear weight for the backward; torchao's Float8Linear
    keeps the float32 weight itself. mlp 40 -> 2048 -> 2048 -> 10 converts only the 2048x2048 layer
    (40 and 10 are not multiples of 16): fp8 plans its 2-byte copy away and its 1-byte float8 cast in."""
    from scaletrain.memory.planner import Planner, PlanRequest

    def activations(precision: str, options=None) -> int:
        req = PlanRequest(model="mlp", model_options={"hidden": [2048, 2048]}, input_shape=(40,), num_classes=10,
                          batch_size=8, precision=precision, precision_options=options)
        return Planner(req).activation_bytes(8)
    square = 2048 * 2048
    assert activations("bf16-mixed") - activations("fp8", EMULATED) == 2 * square - square
    # The layer kept in float32 converts nothing: planned as bf16-mixed.
    kept = PrecisionConfig(policy="fp8", fp8_emulate=True, fp32_modules=["body"])
    assert activations("fp8", kept) == activations("bf16-mixed")


@pytest.mark.usefixtures("processes")
def test_fp8_with_checkpointing_and_fsdps_float8_gather_resumes_exactly(tmp_path):
    from tests.processes import run
    fp8 = ["--precision", "fp8", "--fp8-emulate"]

    def train(folder: str, *extra: str, epochs: int = 1):
        done = run(["train", *GPT, "--epochs", str(epochs), *fp8, *extra, "--run-dir", folder], tmp_path)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done
    # Activation checkpointing recomputes each block's forward, its float8 scales too: the same weights.
    train("plain")
    train("ckpt", "--activation-checkpointing")
    a, b = _weights(tmp_path / "plain"), _weights(tmp_path / "ckpt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # FSDP over two processes gathers the sharded weights in float8 (tensorwise), and a resume of
    # 2 epochs on to 3 gives the 3-epoch run's weights bitwise.
    whole = train("fsdp", "--strategy", "fsdp", "--nproc", "2", epochs=3)
    assert "their sharded weights gathered in float8" in whole.stdout
    train("part", "--strategy", "fsdp", "--nproc", "2", epochs=2)
    resumed = run(["train", *GPT, "--epochs", "3", *fp8, "--strategy", "fsdp", "--nproc", "2", "--run-dir", "part",
                   "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    w3, wr = _weights(tmp_path / "fsdp"), _weights(tmp_path / "part")
    assert w3.keys() == wr.keys() and all(torch.equal(w3[k], wr[k]) for k in w3)


def test_fp8_shapes_names_the_layer_shapes_that_convert_and_is_checked_beside_its_field():
    from torchao.float8.float8_linear import Float8Linear

    from scaletrain.config import TrainConfig
    from scaletrain.errors import ConfigError
    policy = get_policy("fp8")
    options = PrecisionConfig(policy="fp8", fp8_emulate=True, fp8_shapes="32x64")
    model = policy.convert_module(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64)), options=options)
    assert [isinstance(model[i], Float8Linear) for i in (0, 2)] == [True, False]
    assert "2 (64x64: not among --fp8-shapes)" in policy.notes(model, options)[0]
    typo = PrecisionConfig(policy="fp8", fp8_emulate=True, fp8_shapes="32x64,64x23")
    assert "--fp8-shapes names 64x23, which no linear layer of this model has" in "\n".join(
        policy.notes(policy.convert_module(nn.Sequential(nn.Linear(32, 64)), options=typo), typo))
    none = PrecisionConfig(policy="fp8", fp8_emulate=True, fp8_shapes="none")
    assert not any(isinstance(m, Float8Linear)
                   for m in policy.convert_module(nn.Sequential(nn.Linear(32, 64)), options=none).modules())
    cfg = TrainConfig()
    cfg.precision.fp8_shapes = "32x64,big"
    with pytest.raises(ConfigError, match="fp8_shapes.*INxOUT"):
        cfg.validate()


def test_a_shape_converts_only_where_float8_beat_bf16_beyond_the_noise_and_verdicts_are_cached(tmp_path, monkeypatch):
    """The decision on stubbed rounds: a clear win converts, a tie inside the noise and a loss stay
    bf16; the next run reads each shape's rounds from the cache, and a new torch measures again."""
    from scaletrain.training import float8_shapes
    from scaletrain.training.rounds import AGAIN, Confirmation
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rounds = {"4096x4096": [1.6, 1.5, 1.7], "256x256": [1.02, 0.97, 1.04], "64x256": [0.6, 0.7, 0.65]}
    asked: list[str] = []

    def measure(shape, options, device, compiled):
        asked.append(shape.name)
        return Confirmation("fp8", rounds[shape.name], noise=Confirmation(AGAIN, [1.03, 0.98, 1.01]))
    shapes = {name: float8_shapes.LinearShape(2048, *map(int, name.split("x")), True) for name in rounds}
    cpu = torch.device("cpu")
    first = float8_shapes.choose_shapes(shapes, EMULATED, cpu, False, "run1", measure)
    assert first.value == "4096x4096" and sorted(asked) == sorted(rounds)
    assert "256x256 bf16: fp8 1.02x bf16 (0.97-1.04, noise ±3%), not beyond the noise" in first.why
    assert "64x256 bf16: fp8 0.65x bf16 (0.60-0.70, noise ±3%), slower" in first.why
    assert first.figures["4096x4096"]["converts"] and first.figures["64x256"]["rows"] == 2048
    asked.clear()
    again = float8_shapes.choose_shapes(shapes, EMULATED, cpu, False, "run2", measure)
    assert asked == [] and again.value == first.value and "3 of 3 from the cache" in again.why
    # An entry edited into something that is not rounds is measured again, never a crash.
    cache = tmp_path / "scaletrain" / "probe-decisions.json"
    cache.write_text(json.dumps({k: {**v, "ratios": ["fast"]} for k, v in json.loads(cache.read_text()).items()}))
    asked.clear()
    assert float8_shapes.choose_shapes(shapes, EMULATED, cpu, False, "run2b", measure).value == first.value
    assert sorted(asked) == sorted(rounds)
    asked.clear()
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".next")
    float8_shapes.choose_shapes(shapes, EMULATED, cpu, False, "run3", measure)
    assert sorted(asked) == sorted(rounds)
    # Nothing wins: the value says so, and no layer converts.
    assert float8_shapes.choose_shapes({"256x256": shapes["256x256"]}, EMULATED, cpu, True, "run4", measure
                                       ).value == "none"


def test_each_layer_shape_is_traced_at_the_runs_micro_batch_and_measured_for_real_here():
    """The shapes of the small GPT at a micro-batch of 4 (rows: 4 sequences of 32 tokens), found on
    the meta device; and one shape's real rounds, emulated on this CPU (what is timed, not how fast:
    float8 emulated is only ever slower, and a run here never measures: `measures_shapes`)."""
    from scaletrain.models import build_model
    from scaletrain.precision.float8 import measures_shapes
    from scaletrain.training import float8_shapes
    with torch.device("meta"):
        gpt = build_model("gpt", (32,), 65, dim=64, depth=2, heads=4)
        example = torch.zeros(4, 32, dtype=torch.int64)
    shapes = float8_shapes.linear_shapes(gpt, example)
    assert shapes and {s.rows for s in shapes.values()} == {4 * 32}
    assert all(n.split("x") == [str(s.in_features), str(s.out_features)] for n, s in shapes.items())
    assert "64x65" not in shapes     # the head's 65 outputs: not divisible by 16, never measured
    conf = float8_shapes.measure_shape(float8_shapes.LinearShape(64, 64, 64, True), EMULATED, torch.device("cpu"),
                                       compiled=False, rounds=3)
    # (its rounds stop once the verdict is settled: a loss in the first round already is one)
    assert 1 <= len(conf.ratios) <= 3 and all(r > 0 for r in conf.ratios) and len(conf.noise.ratios) == len(conf.ratios)
    assert not measures_shapes(EMULATED, "cpu", None) and not measures_shapes(EMULATED, "cuda", (9, 0))
    assert measures_shapes(PrecisionConfig(policy="fp8"), "cuda", (9, 0))
    assert not measures_shapes(PrecisionConfig(policy="fp8", fp8_shapes="all"), "cuda", (9, 0))


def test_a_run_records_the_shapes_it_measured_and_its_resume_converts_them_without_measuring(
        tmp_path, monkeypatch, capsys):
    """The run's path end to end, in this process: with measuring switched on here (a CPU has no
    float8 tensor cores, so `measures_shapes` is made to say yes, and the rounds run emulated), the
    start line states each shape's verdict, config.json names the shapes, the store keeps the
    rounds, and a resume converts the recorded shapes and measures nothing."""
    from scaletrain.cli.main import main
    from scaletrain.precision import float8 as float8_module
    from scaletrain.tracking import RunStore
    from scaletrain.training import float8_shapes
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(float8_module, "measures_shapes", lambda options, kind, capability:
                        options.fp8_shapes == "auto")
    small = [*GPT[:-4], "--train-subset", "320", "--no-progress", "--no-compile", "--threads", "1",
             "--precision", "fp8", "--fp8-emulate", "--run-dir", "run", "--store", "runs.db", "--run-id", "f1"]
    saved = torch.get_num_threads()
    try:
        assert main(["train", *small, "--epochs", "1"]) == 0
        out = capsys.readouterr().out
        recorded = json.loads((tmp_path / "run" / "config.json").read_text())["precision"]["fp8_shapes"]
        assert recorded != "auto"
        assert "fp8 shapes" in out and "measured on cpu" in out
        measured = RunStore(tmp_path / "runs.db").get("f1").environment["settings"]["fp8 shapes"]
        assert measured["value"] == recorded and all(f["ratios"] for f in measured["measured"].values())
        monkeypatch.setattr(float8_shapes, "measure_shape", lambda *a, **k: pytest.fail("a resume measured"))
        assert main(["train", *small, "--epochs", "2", "--resume", "auto"]) == 0
    finally:
        torch.set_num_threads(saved)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["precision"]["fp8_shapes"] == recorded
