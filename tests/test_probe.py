"""The run's own step decides its precision (training/probe.py): the rule of interleaved rounds on
stubbed timings (a win beyond the noise, a tie inside it, a loss the check refuses, too few
rounds), what bounds a probe, the cache's key and file, and one real probe through the CLI: the
probed run equals the same run with its choice named, the next run reads the cache, a resume and
--no-probe never probe."""

from __future__ import annotations

import json

import pytest
import torch

from scaletrain.training import probe, probe_cache, probe_settings
from scaletrain.training.rounds import AGAIN, Measured, confirm


def decided(speeds: dict[str, list[float]], losses: dict[str, list[float]] | None = None, rounds: int = 3):
    """The probe's decision for fp32 (the reference) against bf16-mixed at these samples/s."""
    found = confirm("fp32", ["bf16-mixed"], rounds, lambda key, r: Measured(speeds[key][r]), lambda v, b: v / b)
    losses = losses or {"fp32": [1.0] * rounds, "bf16-mixed": [1.001] * rounds}
    return probe.decide("fp32", found, losses)


def test_a_candidate_is_chosen_only_beyond_the_noise_in_three_rounds_with_its_loss_kept():
    # 1.4x in every round, the reference within 5 % of itself: chosen, and the line says by how much.
    policy, why, figures = decided({"fp32": [100, 100, 100], AGAIN: [103, 97, 100], "bf16-mixed": [140, 141, 139]})
    assert policy == "bf16-mixed" and why.startswith("probed: 1.40x fp32 (1.39-1.41), loss within 0.10%")
    assert "3 rounds" in why and figures["candidates"]["bf16-mixed"]["rounds_beyond_noise"] == 3
    # A tie: 6-8 % faster, but the reference read 12 % apart from itself.
    policy, why, _ = decided({"fp32": [100, 100, 100], AGAIN: [112, 95, 104], "bf16-mixed": [107, 106, 108]})
    assert policy == "fp32" and "inconclusive" in why and "0 of 3 rounds, 3 needed" in why
    # The noise is taken both ways: a reference at 0.70x of itself is +-43 %, and 1.39x is inside it.
    policy, why, figures = decided({"fp32": [100, 100, 100], AGAIN: [70, 100, 100], "bf16-mixed": [139, 139, 139]})
    assert policy == "fp32" and "±43%" in why and figures["noise"]["band"] == pytest.approx(0.4286, abs=1e-3)
    # Fast but learning something else: refused by the loss check (autotune's 5 % for 16-bit).
    policy, why, _ = decided({"fp32": [100] * 3, AGAIN: [100] * 3, "bf16-mixed": [150] * 3},
                             {"fp32": [1.0] * 3, "bf16-mixed": [1.2] * 3})
    assert policy == "fp32" and "refused: loss departs 20.0% (tolerance 5%)" in why
    # Slower in every round: said so, not a tie.
    policy, why, _ = decided({"fp32": [100] * 3, AGAIN: [100] * 3, "bf16-mixed": [70] * 3})
    assert policy == "fp32" and why.endswith("bf16-mixed 0.70x fp32 (0.70-0.70), slower in every round")
    # Rounds stop once none left could change a verdict: a win in 3, a loss when the rounds left
    # cannot make 3 wins; a tie with a chance goes on to the planned 5.
    def measured(speeds, rounds=5):
        found = confirm("fp32", ["bf16-mixed"], rounds, lambda key, r: Measured(speeds[key][r]), lambda v, b: v / b,
                        until_settled=True)
        return len(found["bf16-mixed"].ratios)
    assert measured({"fp32": [100] * 5, AGAIN: [100] * 5, "bf16-mixed": [140] * 5}) == 3
    assert measured({"fp32": [100] * 5, AGAIN: [100] * 5, "bf16-mixed": [70] * 5}) == 3
    assert measured({"fp32": [100] * 5, AGAIN: [100] * 5, "bf16-mixed": [140, 90, 95, 90, 140]}) == 4
    assert measured({"fp32": [100] * 5, AGAIN: [100] * 5, "bf16-mixed": [140, 95, 95, 140, 140]}) == 5
    # Two rounds cannot make three: inconclusive however fast.
    policy, why, _ = decided({"fp32": [100] * 2, AGAIN: [100] * 2, "bf16-mixed": [200] * 2}, rounds=2)
    assert policy == "fp32" and "2 of 2 rounds, 3 needed" in why


def test_a_run_too_short_to_repay_a_probe_is_not_probed_and_the_budget_bounds_the_rest():
    # The default recipe: 28 steps x 6 epochs; three arms need 24 steps, over 5 % of 168.
    assert probe.probe_cost_steps(3) == 24
    assert "not probed: 168 steps are too few" in probe.too_short(168, 3, 0.05)
    assert probe.too_short(480, 3, 0.05) is None and probe.too_short(10, 3, 1.0) is None    # 1: always
    assert probe.budget_s(10_000, 0.05) == probe.PROBE_CAP_S and probe.budget_s(100, 0.05) == 5.0
    # 30 ms a step, 3 arms: 5 s holds 5 rounds of 11-step windows; 0.3 s cannot hold 3 rounds of 2.
    assert probe.plan_windows(0.03, 3, 5.0) == (5, 11)
    assert probe.plan_windows(0.03, 3, 0.6) == (3, 2)
    assert probe.plan_windows(0.03, 3, 0.3) is None
    # A step of 0.1 s or more is timed one at a time (5 rounds of one step); a shorter one in 2 or more.
    assert probe.plan_windows(0.14, 3, 2.5) == (5, 1) and probe.plan_windows(0.09, 3, 2.5) == (4, 2)
    assert probe.plan_windows(0.14, 3, 1.3) == (3, 1) and probe.plan_windows(0.09, 3, 1.3) is None


def test_the_cache_holds_a_decision_per_model_input_and_torch_and_ignores_a_damaged_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    key = probe_cache.cache_key(model, torch.zeros(1, 8), 64, "cpu x", 2, ["fp32", "bf16-mixed"])
    assert probe_cache.cached_entry(key) is None
    entry = probe.Probed(probe.Decision("bf16-mixed", "probed: 1.50x fp32", {"rounds": 3}), None).cache_entry()
    probe_cache.remember(key, entry, "run1")
    kept = probe_cache.cached_entry(key)
    assert kept["policy"] == "bf16-mixed" and kept["run_id"] == "run1"
    # Another input shape, another model, another torch: another key (a miss).
    assert probe_cache.cache_key(model, torch.zeros(1, 9), 64, "cpu x", 2, ["fp32", "bf16-mixed"]) != key
    assert probe_cache.cache_key(torch.nn.Sequential(torch.nn.Linear(8, 5)), torch.zeros(1, 8), 64, "cpu x", 2,
                           ["fp32", "bf16-mixed"]) != key
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert probe_cache.cache_key(model, torch.zeros(1, 8), 64, "cpu x", 2, ["fp32", "bf16-mixed"]) != key
    (tmp_path / "scaletrain" / probe_cache.CACHE_FILE).write_text("{not json")
    assert probe_cache.cached_entry(key) is None


QUICK = ["--model", "mlp", "--model-option", "hidden=[256,256]", "--data", "digits", "--batch-size", "32",
         "--no-compile", "--epochs", "3", "--threads", "1", "--no-progress"]


def _skip_without_native_bf16() -> None:
    from scaletrain.precision.hardware import CPU_BF16_FLAGS, device_facts
    if not device_facts(torch.device("cpu")).cpu_flags & CPU_BF16_FLAGS:
        pytest.skip("this CPU computes no bfloat16 natively: fp32 is its only precision, nothing to probe")


def _settings_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("settings:"))


def _weights(folder) -> dict:
    return torch.load(folder / "model.pt", map_location="cpu", weights_only=True)


@pytest.mark.usefixtures("processes")
def test_a_probed_run_equals_its_choice_named_and_the_next_run_starts_from_the_cache(tmp_path):
    from tests.processes import run
    _skip_without_native_bf16()
    home = str(tmp_path / "cache")
    probed = run(["train", *QUICK, "--probe-share", "1", "--run-dir", "a", "--checkpoint-every", "20"], tmp_path,
                 XDG_CACHE_HOME=home)
    assert probed.returncode == 0, probed.stdout[-2000:] + probed.stderr[-2000:]
    line = _settings_line(probed.stdout)
    assert "(auto: probed" in line, line
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    chosen, run_id = summary["precision"], summary["run_id"]
    assert summary["probe_s"] > 0
    # The same run with the choice named: bitwise the same weights (the probe trained copies).
    named = run(["train", *QUICK, "--precision", chosen, "--run-dir", "b"], tmp_path, XDG_CACHE_HOME=home)
    assert named.returncode == 0, named.stderr[-2000:]
    assert f"precision {chosen};" in _settings_line(named.stdout)        # named: never probed
    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The next run of the same model here starts from the decision, at once, though on its own it
    # would be too short to probe (no --probe-share 1).
    again = run(["train", *QUICK, "--run-dir", "c"], tmp_path, XDG_CACHE_HOME=home)
    assert f"precision {chosen} (cached from run {run_id}: probed" in _settings_line(again.stdout)
    assert json.loads((tmp_path / "c" / "summary.json").read_text())["probe_s"] == 0
    # A cache edited to name what this run could not have chosen is not taken: the run probes.
    cache = tmp_path / "cache" / "scaletrain" / probe_cache.CACHE_FILE
    cache.write_text(json.dumps({k: {**v, "policy": "fp16-mixed"} for k, v in json.loads(cache.read_text()).items()}))
    edited = run(["train", *QUICK, "--probe-share", "1", "--run-dir", "e"], tmp_path, XDG_CACHE_HOME=home)
    assert "(auto: probed" in _settings_line(edited.stdout) and "fp16" not in _settings_line(edited.stdout)
    # A resume continues in the recorded precision, and --no-probe keeps the rule.
    resumed = run(["train", *QUICK[:-3], "--epochs", "4", "--threads", "1", "--no-progress", "--run-dir", "a",
                   "--resume", "auto", "--probe-share", "1"], tmp_path, XDG_CACHE_HOME=home)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "probed" not in _settings_line(resumed.stdout) and f"precision {chosen}" in _settings_line(resumed.stdout)
    rule = run(["train", *QUICK, "--no-probe", "--run-dir", "d"], tmp_path, XDG_CACHE_HOME=home)
    assert "precision fp32 (auto: on a CPU" in _settings_line(rule.stdout) and "probe" not in _settings_line(rule.stdout)
    # The store keeps how each was chosen, and `runs compare` says it.
    from tests.processes import run_here
    ids = [json.loads((tmp_path / f / "summary.json").read_text())["run_id"] for f in ("a", "b", "c", "d")]
    table = run_here(["runs", "compare", *ids], tmp_path).stdout
    assert "(probed: " in table and "(cached: " in table and "(auto)" in table, table
    from scaletrain.tracking.store import RunStore
    with RunStore(tmp_path / "scaletrain-runs" / "runs.db") as store:   # the resume kept how it was chosen
        kept = store.get(ids[0]).environment["settings"]["precision"]
    assert kept["chosen"].startswith("auto: probed") and kept["measured"]["reference"] == "fp32"
    assert set(kept["measured"]["candidates"]) == {"bf16-mixed"} and kept["measured"]["rounds"] >= 3


def test_an_arm_trains_a_probes_steps_even_where_the_run_has_fewer(digits):
    """A short run probed with --probe-share 1: each arm may train more steps than the run's whole
    schedule holds (here 2 steps an epoch, 1 epoch); its schedule is long enough for the most a
    probe trains, and every window's loss is a number."""
    import math

    from scaletrain.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
    from scaletrain.training.build import build_training
    cfg = TrainConfig(model=ModelConfig(name="mlp", options={"hidden": [8]}), data=DataConfig(name="digits"),
                      batch_size=512, epochs=1, threads=1, progress=False, optim=OptimConfig(lr_schedule="onecycle"))
    cfg.tracking.record = False
    arm = probe.Arm(build_training(cfg, dataset=digits, checked=True).trainer, digits)
    assert arm.steps_per_epoch * cfg.epochs < probe.MAX_ARM_STEPS
    for _ in range(probe.MAX_ARM_STEPS // arm.steps_per_epoch):
        seconds, loss = arm.window(arm.steps_per_epoch)
        assert seconds > 0 and math.isfinite(loss)
    arm.close()


class _FakeArm:
    """An arm on stubbed timings: `seconds[key]` a step (key: a precision, with " compiled" for a
    compiled copy); the loss falls the same way in every one. `fail_at`: the window (counted per
    arm) at which this key's arm raises."""

    def __init__(self, policy: str, seconds: dict, fail_at: dict):
        self.policy, self.seconds, self.fail_at, self.windows, self.steps = policy, seconds, fail_at, 0, 0

    def window(self, steps: int):
        self.windows += 1
        if self.windows == self.fail_at.get(self.policy):
            raise RuntimeError(f'"addmm" not implemented for {self.policy}\nmore')
        self.steps += steps
        return steps * self.seconds[self.policy], 2.0 / (1 + self.steps / 100)

    def close(self):
        pass


def test_the_probe_on_stubbed_timings_chooses_and_a_candidate_that_fails_is_never_chosen():
    seconds = {"fp32": 0.030, "bf16-mixed": 0.020}

    def probed(fail_at=None, share=0.05, steps=10_000):
        return probe.run_probe("fp32", ["bf16-mixed"], lambda p: _FakeArm(p, seconds, fail_at or {}), steps,
                               share).precision
    chosen = probed()
    assert chosen.value == "bf16-mixed" and chosen.why.startswith("probed: 1.50x fp32 (1.50-1.50)")
    # 5 rounds planned; after 3 beyond the noise no round left could change the verdict: it stops.
    assert (chosen.figures["rounds"], chosen.figures["rounds_planned"]) == (probe.MIN_ROUNDS, probe.MAX_ROUNDS)
    assert len(chosen.figures["candidates"]["bf16-mixed"]["ratios"]) == probe.MIN_ROUNDS
    # bf16 has no kernel for this model: said, and the run keeps fp32.
    broken = probed({"bf16-mixed": 1})
    assert broken.value == "fp32" and "bf16-mixed failed: RuntimeError: \"addmm\" not implemented" in broken.why
    # It won the first rounds, then failed (its 4th window: the 3rd round): not chosen on those.
    late = probed({"bf16-mixed": 4})
    assert late.value == "fp32" and "bf16-mixed failed" in late.why
    # The reference itself fails: not probed, the run's own step will say why.
    assert probed({"fp32": 1}).why.startswith("not probed: the step failed on a copy of the run (RuntimeError")
    # A run predicted short of the smallest probe stops after the reference's two copies.
    short = probed(steps=300)
    assert short.value == "fp32" and short.why.startswith("not probed: this run is predicted to take 9.0 s")


def _compile_rounds(ratio: float, noise: float = 1.0, rounds: int = 3):
    return probe.Confirmation(probe.COMPILED, [ratio] * rounds, noise=probe.Confirmation(AGAIN, [noise] * rounds))


def test_compile_is_chosen_only_where_the_steps_it_saves_repay_its_compile_twice():
    # 1.5x a 30 ms step saves 10 ms a step: 100 s over 10,000 steps repays a 20 s compile 5x.
    on, why, figures = probe.decide_compile("fp32", _compile_rounds(1.5), 0.001, 20.0, 0.03, 10_000)
    assert on and why.startswith("probed: compiled 1.50x eager (1.50-1.50), loss within 0.10%, its 20 s compile "
                                 "repaid 5.0x over 10,000 steps")
    # The same gain over 1,000 steps saves 10 s: under twice the compile, so eager.
    on, why, _ = probe.decide_compile("fp32", _compile_rounds(1.5), 0.001, 20.0, 0.03, 1_000)
    assert not on and why.endswith("but its 20 s compile would save 10 s over 1,000 steps (2x its cost needed)")
    # A tie inside the noise, a loss the check refuses (fp32's 2 %: compiling only reorders), slower.
    assert "inconclusive" in probe.decide_compile("fp32", _compile_rounds(1.1, noise=0.8), 0.0, 1.0, 0.03, 10**6)[1]
    assert "refused: loss departs 3.0% (tolerance 2%)" in probe.decide_compile("fp32", _compile_rounds(2.0), 0.03,
                                                                                   1.0, 0.03, 10**6)[1]
    assert probe.decide_compile("fp32", _compile_rounds(0.9), 0.0, 1.0, 0.03, 10**6)[1].endswith("slower in every round")
    # A kept decision is judged again for the next run's length (the cache's figures).
    _, _, figures = probe.decide_compile("fp32", _compile_rounds(1.5), 0.001, 20.0, 0.03, 10_000)
    assert probe.compile_from_figures(figures, 10_000)[0] and not probe.compile_from_figures(figures, 1_000)[0]


def test_compile_is_probed_in_the_precision_chosen_on_new_copies_and_a_compile_that_fails_is_off():
    seconds = {"fp32": 0.030, "bf16-mixed": 0.020, "bf16-mixed compiled": 0.010, "fp32 compiled": 0.015}
    built: list[str] = []

    def make(fail_at):
        def arm(key):
            built.append(key)
            return _FakeArm(key, seconds, fail_at)
        return arm
    # Long enough that 5 % holds a compile (30 ms x 20,000 steps: 30 s).
    probed = probe.run_probe("fp32", ["bf16-mixed"], make({}), 20_000, 0.05, compile_asked=True)
    assert probed.precision.value == "bf16-mixed" and probed.compile.value is True
    assert probed.compile.figures["policy"] == "bf16-mixed" and probed.compile.why.startswith("probed: compiled 2.00x")
    # The eager step it was measured against trained from step 0 too (two new bf16 copies).
    assert built == ["fp32", "fp32", "bf16-mixed", "bf16-mixed", "bf16-mixed", "bf16-mixed compiled"]
    # With the precision named (no candidates), the reference's own copies are the eager side.
    built.clear()
    alone = probe.run_probe("fp32", [], make({}), 20_000, 0.05, compile_asked=True)
    assert alone.precision is None and alone.compile.value is True and built == ["fp32", "fp32", "fp32 compiled"]
    failed = probe.run_probe("fp32", [], make({"fp32 compiled": 1}), 20_000, 0.05, compile_asked=True).compile
    assert failed.value is False and failed.why.startswith("probed, off: compiling failed: RuntimeError")
    # A run whose 5 % cannot hold a compile: not probed, and said why; the precision still is.
    short = probe.run_probe("fp32", ["bf16-mixed"], make({}), 5_000, 0.05, compile_asked=True)
    assert short.precision.value == "bf16-mixed" and short.compile.value is False
    assert short.compile.why.startswith("not probed: the probe's 8 s (5% of the run's predicted 150 s) cannot hold "
                                        "a compile")
    # Compile alone asked, and one copy's step says it cannot fit: no second copy is built.
    built.clear()
    alone_short = probe.run_probe("fp32", [], make({}), 5_000, 0.05, compile_asked=True)
    assert alone_short.compile.value is False and built == ["fp32"] and alone_short.step_s == pytest.approx(0.03)
    kept = short.cache_entry()    # the precision kept; compile left open, for a longer run to ask
    assert kept["policy"] == "bf16-mixed" and "compile" not in kept and kept["step_s"] == pytest.approx(0.03)


def test_cuda_graphs_are_a_question_on_a_gpu_measured_last_and_never_on_top_of_a_compile():
    from scaletrain.training.defaults import choose_cuda_graphs
    # Asked only on a GPU, unnamed, one step per execution, under a strategy that can capture.
    assert choose_cuda_graphs(None, 1, "cuda", True).why.startswith("auto: off")
    assert [choose_cuda_graphs(*a) for a in ((True, 1, "cuda", True), (None, 8, "cuda", True), (None, 1, "cpu", True),
                                             (None, 1, "cuda", False))] == [None] * 4
    assert probe.probe_config(_config(), "bf16-mixed graphs", 1).cuda_graphs is True
    seconds = {"fp32": 0.030, "bf16-mixed": 0.020, "bf16-mixed graphs": 0.012, "fp32 compiled": 0.015}
    built: list[str] = []

    def make(key):
        built.append(key)
        return _FakeArm(key, seconds, {})
    probed = probe.run_probe("fp32", ["bf16-mixed"], make, 20_000, 0.05, graphs_asked=True)
    # In the precision chosen, against two new eager copies of it (the loss check's same steps).
    assert probed.precision.value == "bf16-mixed" and probed.graphs.value is True
    assert probed.graphs.why.startswith("probed: CUDA graph 1.67x eager (1.67-1.67), loss within")
    assert built == ["fp32", "fp32", "bf16-mixed", "bf16-mixed", "bf16-mixed", "bf16-mixed graphs"]
    assert probed.decided()["cuda_graphs"][0] is True and probed.cache_entry()["cuda_graphs"]["policy"] == "bf16-mixed"
    # A kept decision is taken for a run as long, and judged again for a shorter one.
    kept = {"run_id": "r1", "cuda_graphs": probed.cache_entry()["cuda_graphs"]}
    assert probe_settings._from_cache(kept, "bf16-mixed", [], False, True, 20_000)["cuda_graphs"][0] is True
    # Compile chosen: graphs are not measured on top of it.
    both = probe.run_probe("fp32", [], make, 200_000, 0.05, compile_asked=True, graphs_asked=True)
    assert both.compile.value is True and both.graphs.value is False and "compiled" in both.graphs.why
    # Slower captured (a step that is not launch-bound): off.
    seconds["fp32 graphs"] = 0.040
    assert probe.run_probe("fp32", [], make, 20_000, 0.05, graphs_asked=True).graphs.why.endswith(
        "slower in every round")


@pytest.mark.cuda
def test_on_a_gpu_the_probe_asks_cuda_graphs_and_the_run_trains_in_its_answer(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from tests.processes import run
    done = run(["train", *QUICK, "--probe-share", "1", "--run-dir", "g"], tmp_path, XDG_CACHE_HOME=str(tmp_path / "c"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    line = _settings_line(done.stdout)
    assert "(auto: probed" in line.partition("cuda_graphs ")[2], line
    assert json.loads((tmp_path / "g" / "summary.json").read_text())["cuda_graphs"] == ("cuda_graphs on" in line)


def _config():
    from scaletrain.config import TrainConfig
    return TrainConfig()


USER_CODE = """
import torch
from torch import nn
from torch.utils.data import Dataset

class Points(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 16, generator=g)
        self.y = (self.x.sum(1) > 0).long()
    def __len__(self):
        return len(self.y)
    def __getitem__(self, i):
        return self.x[i], self.y[i]

def splits():
    return {"train": Points(1024, 0), "val": Points(128, 1)}

class Net(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, num_classes))
    def forward(self, x):
        return self.body(x)
"""


@pytest.mark.usefixtures("processes")
def test_a_users_own_model_and_torch_dataset_are_probed_through_their_loader(tmp_path):
    """The user's nn.Module and torch Dataset, read by a DataLoader with a worker: the copies read
    the user's batches, end their workers, and the run trains in what the probe chose, compiled or
    not (a real compile, measured in the precision chosen)."""
    from tests.processes import run
    _skip_without_native_bf16()
    (tmp_path / "mine.py").write_text(USER_CODE)
    done = run(["train", "--model", "mine:Net", "--data", "mine:splits", "--epochs", "2", "--batch-size", "64",
                "--num-workers", "1", "--probe-share", "1", "--no-progress", "--run-dir", "r"], tmp_path,
               XDG_CACHE_HOME=str(tmp_path / "cache"), timeout=300,
               # Started from the rig's fork server, a compile beside a DataLoader worker hung (the
               # same command from a shell takes 15 s): a cold interpreter, as a user's is.
               cold=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    line = _settings_line(done.stdout)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert "(auto: probed" in line and summary["probe_s"] > 0, line
    assert line.startswith(f"settings: precision {summary['precision']} ")
    # Compile, not named, was measured too (in the precision chosen), and the run did what it chose.
    compiled = "compile on (auto: probed: compiled" in line
    assert compiled or "compile off (auto: probed, off: compiled" in line, line
    assert summary["compile"] is compiled


@pytest.mark.usefixtures("processes")
def test_under_nproc_the_chief_decides_and_every_rank_trains_in_its_choice(tmp_path):
    """Two processes of DDP: rank 0 measures one process's step alone (or reads the cache) and
    every rank takes its decision. The cache is edited to say bf16-mixed, whatever this machine
    measured: were rank 1 to train in the rule's fp32 beside a rank 0 in bf16-mixed, their averaged
    gradients, and so the weights, would differ from the same run with bf16-mixed named."""
    from tests.processes import run
    _skip_without_native_bf16()
    home = str(tmp_path / "cache")
    probed = run(["train", *QUICK, "--nproc", "2", "--probe-share", "1", "--run-dir", "a"], tmp_path,
                 XDG_CACHE_HOME=home)
    assert probed.returncode == 0, probed.stdout[-2000:] + probed.stderr[-2000:]
    assert "(auto: probed" in _settings_line(probed.stdout), _settings_line(probed.stdout)
    cache = tmp_path / "cache" / "scaletrain" / probe_cache.CACHE_FILE
    cache.write_text(json.dumps({k: {**v, "policy": "bf16-mixed"} for k, v in json.loads(cache.read_text()).items()}))
    cached = run(["train", *QUICK, "--nproc", "2", "--probe-share", "1", "--run-dir", "c"], tmp_path,
                 XDG_CACHE_HOME=home)
    assert "precision bf16-mixed (cached from run" in _settings_line(cached.stdout), _settings_line(cached.stdout)
    named = run(["train", *QUICK, "--nproc", "2", "--precision", "bf16-mixed", "--run-dir", "b"], tmp_path,
                XDG_CACHE_HOME=home)
    assert named.returncode == 0, named.stderr[-2000:]
    c, b = _weights(tmp_path / "c"), _weights(tmp_path / "b")
    assert all(torch.equal(c[k], b[k]) for k in c)


def test_a_kept_precision_is_taken_and_a_compile_left_open_is_asked_only_where_it_can_fit():
    kept = {"run_id": "r1", "policy": "bf16-mixed", "why": "probed: 1.50x fp32", "figures": {"rounds": 3},
            "step_s": 0.03}
    found = probe_settings._from_cache(kept, "fp32", ["bf16-mixed"], True, False, 1_000)
    assert found["precision"][:2] == ("bf16-mixed", "cached from run r1: probed: 1.50x fp32") and "compile" not in found
    # 1,000 steps of 30 ms: 5 % is 1.5 s, no compile fits: said from the kept step time, no copy built.
    assert probe_settings._compile_unfit_by_cache(kept, 1_000, 0.05).startswith("not probed: the probe's 2 s (5% of "
                                                                                "the "
                                                                       "run's predicted 30 s) cannot hold a compile")
    assert probe_settings._compile_unfit_by_cache(kept, 100_000, 0.05) is None     # 150 s: a longer run asks it
    assert probe_settings._compile_unfit_by_cache(kept, 1_000, 1.0) is None         # --probe-share 1 measures anyway
    # A kept precision this run could not choose is no hit at all.
    assert probe_settings._from_cache({**kept, "policy": "fp16-mixed"}, "fp32", ["bf16-mixed"], True, False, 1_000) == {}
