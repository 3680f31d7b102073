"""`scaletrain autotune` through the real CLI: every candidate a real training process, a real
Optuna study in SQLite, the real planner and run store."""

import importlib.util
import json
import os
import re
import signal
import time
import types

import pytest

from scaletrain.tracking.store import RunStore
from tests.processes import run, run_here, start, wait_for, warm_children

pytest.importorskip("optuna")

# The MLP on digits, measured for 4 steps x 2 epochs (a warm-up and one measured) per candidate;
# the search's own figures decide (the interleaved confirmation has tests of its own).
SMALL = ["--model", "mlp", "--model-option", "hidden=[64]", "--data", "digits", "--batch-size", "64",
         "--steps", "4", "--window-epochs", "2", "--no-progress", "--confirm-rounds", "0"]


def _result(out):
    return json.loads((out / "autotune.json").read_text())


def _rows(out, outcome=None):
    return [r for r in _result(out)["rows"] if outcome is None or r["outcome"] == outcome]


@pytest.mark.usefixtures("processes")
def test_a_candidate_that_learns_differently_is_refused_and_the_best_toml_trains(tmp_path):
    out = tmp_path / "tuned"
    # The caller runs two threads: the given configuration is theirs, one thread the candidate.
    done = run(["autotune", *SMALL, "--model", "faulty_models:single_thread_differs_mlp", "--knobs", "threads",
                "--trials", "2", "--out", str(out), "--store", str(tmp_path / "runs.db")], tmp_path, OMP_NUM_THREADS="2")
    assert done.returncode == 0, done.stdout + done.stderr
    refused = _rows(out, "refused")
    assert [r["params"]["threads"] for r in refused] == [1]
    assert "loss departs" in refused[0]["why"] and refused[0]["departure"] > 0.02
    baseline = _rows(out, "measured")
    assert [r["params"]["threads"] for r in baseline] == [2] and baseline[0]["images_per_sec"] > 0
    assert len(baseline[0]["loss"]) == 2 and baseline[0]["warmup_s"] > 0
    assert _result(out)["best"] == {"threads": 2}
    if importlib.util.find_spec("matplotlib"):     # the report extra draws the speed/memory plot
        assert (out / "speed_memory.png").read_bytes()[:4] == b"\x89PNG"
    # Both trials are runs in the store, under the autotune's group, the best marked as its choice.
    group = re.search(r"trials in the store under group (\S+)", done.stdout).group(1)
    assert group.startswith("autotune-autotune-")        # its own --out: a group of its own (issue 66)
    store = RunStore(str(tmp_path / "runs.db"))
    assert sorted(r.group for r in store.runs()) == [group] * 2
    assert store.chosen(group) == baseline[0]["run_id"]
    store.close()
    if importlib.util.find_spec("matplotlib"):     # `runs report` stars it in the speed/memory plot
        report = run_here(["runs", "report", "--group", group, "-o", str(tmp_path / "r.html"),
                           "--store", str(tmp_path / "runs.db")], tmp_path)
        assert report.returncode == 0, report.stderr
        page = (tmp_path / "r.html").read_text()
        # (matplotlib's SVG keeps each text as a comment beside its glyphs: here the legend's entry)
        assert "Throughput against peak memory" in page and page.count("(chosen) -->") == 1
        assert re.search(rf"<!-- {baseline[0]['run_id']} [^>]*\(chosen\) -->", page)
    # The best configuration is a plain training config: it trains as written.
    again = run(["train", "--config", str(out / "best.toml"), "--epochs", "1", "--run-dir", str(tmp_path / "again"),
                 "--store", str(tmp_path / "runs.db")], tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.usefixtures("processes")
def test_a_candidate_that_runs_out_of_memory_is_recorded_and_skipped(tmp_path):
    out = tmp_path / "tuned"
    done = run(["autotune", *SMALL, "--model", "faulty_models:runtime_oom_mlp", "--grad-accum-steps", "2",
                "--knobs", "grad_accum_steps", "--trials", "3", "--out", str(out),
                "--store", str(tmp_path / "runs.db")], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    by_accum = {r["params"]["optim.grad_accum_steps"]: r for r in _rows(out)}
    assert set(by_accum) == {1, 2, 4}
    assert by_accum[1]["outcome"] == "failed" and "OutOfMemoryError" in by_accum[1]["why"]
    assert by_accum[2]["outcome"] == by_accum[4]["outcome"] == "measured"
    assert _result(out)["best"]["optim.grad_accum_steps"] in (2, 4)


@pytest.mark.usefixtures("processes")
def test_the_planner_discards_what_will_not_fit_before_anything_runs(tmp_path):
    from scaletrain.memory.planner import Planner, PlanRequest
    plans = {}
    for accum in (4, 1):
        req = PlanRequest(model="mlp", model_options={"hidden": [2048, 2048]}, input_shape=(1, 8, 8), num_classes=10,
                          batch_size=512 // accum, precision="fp32")
        plans[accum] = Planner(req).plan("ddp", 1, 512 // accum).total_bytes
    assert plans[1] > plans[4]
    budget = int((plans[1] + plans[4]) / 2 / 0.95)      # the planner keeps 5 % headroom
    out = tmp_path / "tuned"
    done = run(["autotune", "--model", "mlp", "--model-option", "hidden=[2048, 2048]", "--data", "digits",
                "--batch-size", "512", "--grad-accum-steps", "4", "--steps", "2", "--window-epochs", "2",
                "--knobs", "grad_accum_steps", "--trials", "1", "--device-memory", str(budget), "--no-progress",
                "--out", str(out), "--store", str(tmp_path / "runs.db")], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    discarded = {r["params"]["optim.grad_accum_steps"]: r["why"] for r in _rows(out, "discarded")}
    assert 1 in discarded and discarded[1].startswith("planner: needs")
    assert [r["params"]["optim.grad_accum_steps"] for r in _rows(out, "measured")] == [4]
    assert not (out / "trials" / "trial-0001").exists()      # nothing else ran


@pytest.mark.usefixtures("processes")
def test_a_model_that_raises_while_traced_loses_that_candidate_not_the_search(tmp_path):
    out = tmp_path / "tuned"
    done = run(["autotune", "--model", "faulty_models:picky_mlp", "--model-option", "max_batch=300", "--data", "digits",
                "--batch-size", "512", "--grad-accum-steps", "4", "--steps", "2", "--window-epochs", "2",
                "--knobs", "grad_accum_steps", "--trials", "1", "--no-progress",
                "--out", str(out), "--store", str(tmp_path / "runs.db")], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    discarded = {r["params"]["optim.grad_accum_steps"]: r["why"] for r in _rows(out, "discarded")}
    assert discarded[1].startswith("the model raised while the planner traced it (ValueError: batches above 300")
    assert [r["params"]["optim.grad_accum_steps"] for r in _rows(out, "measured")] == [4]


@pytest.mark.usefixtures("processes")
def test_under_nproc_the_strategy_is_searched_and_the_model_rules_discard_before_anything_runs(tmp_path):
    out = tmp_path / "tuned"
    # Sync batch norm: the sharding strategies refuse it (their model rule), ddp and zero1 keep it.
    done = run(["autotune", "--confirm-rounds", "0", "--model", "cnn1d", "--data", "mnist1d", "--batch-size", "64", "--steps", "4",
                "--window-epochs", "2", "--no-progress", "--nproc", "2", "--sync-batchnorm", "--knobs", "strategy",
                "--trials", "2", "--out", str(out), "--store", str(tmp_path / "runs.db")], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    discarded = {r["params"]["distributed.strategy"]: r["why"] for r in _rows(out, "discarded")}
    assert set(discarded) == {"zero2", "fsdp", "hsdp"}
    assert all("--sync-batchnorm is not supported with --strategy" in why for why in discarded.values())
    measured = {r["params"]["distributed.strategy"]: r for r in _rows(out, "measured")}
    assert set(measured) == {"auto", "zero1"}
    # Both trained the same seeded steps under two processes: ZeRO-1 only shards the optimizer state.
    assert measured["zero1"]["departure"] < 1e-3
    store = RunStore(str(tmp_path / "runs.db"))
    for row in measured.values():
        record = store.get(row["run_id"])
        assert record.config["distributed"]["nproc"] == 2 and record.summary_value("world_size") == 2
        # The launcher shared the cores out: one thread per worker here, not a slot's whole share each.
        assert record.environment["device"].endswith(", 1 threads)"), record.environment["device"]
    store.close()
    assert 'nproc = 2' in (out / "best.toml").read_text()


@pytest.mark.usefixtures("processes")
def test_killed_and_rerun_it_goes_on_where_it_stopped(tmp_path):
    out = tmp_path / "tuned"
    # Each training forward sleeps 0.2 s, so a trial lasts long enough to be killed in the middle.
    args = ["autotune", *SMALL, "--model", "faulty_models:slow_mlp", "--model-option", "delay_s=0.2",
            "--knobs", "threads,grad_accum_steps", "--trials", "3", "--out", str(out),
            "--store", str(tmp_path / "runs.db")]
    # Its trainings start warm (the pool's death signal reaches each through its stand-in).
    first = start(args, tmp_path, tmp_path / "first.log", **warm_children())
    started = lambda: sorted(p.name for p in (out / "trials").glob("trial-*")) if (out / "trials").exists() else []
    try:
        wait_for(lambda: len(started()) >= 2 or first.poll() is not None, 180, "the second trial to start")
        assert first.poll() is None, (tmp_path / "first.log").read_text()
        time.sleep(1.0)                            # inside the second trial's training
        first.send_signal(signal.SIGKILL)          # its training dies with it (PR_SET_PDEATHSIG)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    done_before, killed = [int(n.split("-")[1]) for n in started()[:1]], int(started()[1].split("-")[1])
    second = run(args, tmp_path, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"trial {killed} was cut short by a killed autotune" in second.stdout
    tried = [r for r in _rows(out) if r["outcome"] not in ("not tried", "discarded")]
    keys = [json.dumps(r["params"], sort_keys=True) for r in tried]
    assert len(tried) == 3 and len(set(keys)) == 3          # three candidates, none measured twice
    numbers = {r["trial"] for r in tried}
    assert set(done_before) <= numbers and killed not in numbers   # kept, not run again; the killed one asked anew
    # The same folder asked to tune another training: refused, not scored by this one's measurements.
    other = run(["delay_s=0.1" if a == "delay_s=0.2" else a for a in args], tmp_path)
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr[-2000:]
    assert "holds a study of another training (it differs in model.options)" in other.stderr, other.stderr


@pytest.mark.usefixtures("processes")
def test_stopped_while_the_given_configuration_ran_the_rerun_still_checks_every_loss(tmp_path):
    """SIGTERM while the given configuration (trial 0) trains: the rerun measures it again and every
    candidate's loss is checked against it, those measured before it too (issue 66: the rerun had
    compared none, `departure: null`)."""
    out = tmp_path / "tuned"
    args = ["autotune", *SMALL, "--model", "faulty_models:slow_mlp", "--model-option", "delay_s=0.1",
            "--knobs", "threads,grad_accum_steps", "--trials", "3", "--confirm-rounds", "0", "--out", str(out),
            "--store", str(tmp_path / "runs.db")]
    first = start(args, tmp_path, tmp_path / "first.log", **warm_children())   # its trainings warm
    try:
        wait_for(lambda: (out / "trials" / "trial-0000").exists() or first.poll() is not None, 180,
                 "the given configuration's trial to start")
        assert first.poll() is None, (tmp_path / "first.log").read_text()
        time.sleep(1.0)                            # inside the given configuration's training
        first.send_signal(signal.SIGTERM)
        first.wait(60)
    finally:
        if first.poll() is None:
            first.kill()
    second = run(args, tmp_path, timeout=400)
    assert second.returncode == 0, second.stdout + second.stderr
    rows = _rows(out)
    result = _result(out)
    given, = [r for r in rows if r["params"] == result["baseline"] and r["outcome"] == "measured"]
    assert given["loss"]
    others = [r for r in rows if r["params"] != result["baseline"] and r["outcome"] in ("measured", "refused")]
    assert others and all(r["departure"] is not None for r in others), others


@pytest.fixture(scope="module")
def one_study_s(tmp_path_factory) -> float:
    """How long a one-candidate study of SMALL takes here now (its start-up plus one run), timed
    once for the budget tests (their tests declare `processes`), which size their budgets by it."""
    folder = tmp_path_factory.mktemp("one-study")
    started = time.perf_counter()
    one = run(["autotune", *SMALL, "--knobs", "threads", "--trials", "1", "--out", str(folder / "one"),
               "--store", str(folder / "one.db")], folder, OMP_NUM_THREADS="2")
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    return time.perf_counter() - started


@pytest.mark.usefixtures("processes")
def test_a_budget_that_runs_out_stops_the_candidate_in_flight_and_reports_the_best_so_far(tmp_path, one_study_s):
    """--budget-s bounds the whole search: the `threads = 1` candidate hangs (a model made slow on
    purpose), is stopped when the budget runs out, and the baseline measured before it is the answer.
    The budget is 4 of this machine's one-candidate studies (the baseline is one), at most 45 s (the
    fixed figure it had: on a quiet AVX-512 CPU a study takes about 4 s, and the test waited 45)."""
    out, budget = tmp_path / "tuned", min(45, round(4 * one_study_s))
    # --cap-factor out of the way: on a quiet machine the baseline's 3 s run caps the hang at 30 s,
    # before the budget (it passed under the suite's load, where the baseline took longer).
    done = run(["autotune", *SMALL, "--model", "faulty_models:single_thread_hangs_mlp", "--knobs", "threads",
                "--trials", "2", "--budget-s", str(budget), "--cap-factor", "1000", "--out", str(out),
                "--store", str(tmp_path / "runs.db")], tmp_path, OMP_NUM_THREADS="2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"the --budget-s of {budget} s ran out" in done.stdout
    measured, stopped = _rows(out, "measured"), _rows(out, "stopped")
    assert [r["params"]["threads"] for r in measured] == [2]
    assert [r["params"]["threads"] for r in stopped] == [1]
    assert stopped[0]["why"] == f"the --budget-s of {budget:g} s ran out while it ran"
    assert _result(out)["best"] == {"threads": 2}
    store = RunStore(str(tmp_path / "runs.db"))   # the stopped candidate's run is ended, not left running
    assert store.get(stopped[0]["run_id"]).status == "failed"
    store.close()


@pytest.mark.usefixtures("processes")
def test_a_budget_too_small_for_one_candidate_is_refused_before_anything_runs(tmp_path):
    """A few of the given configuration's steps are timed first, in autotune's own process: a
    budget that cannot hold measuring it says so, with what would, before a study or a trial exists."""
    out = tmp_path / "tuned"
    done = run(["autotune", *SMALL, "--budget-s", "0.5", "--out", str(out), "--store", str(tmp_path / "runs.db")],
               tmp_path)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    line, = [ln for ln in (done.stdout + done.stderr).splitlines() if "cannot hold one candidate" in ln]
    assert line.startswith("scaletrain: error: --budget-s 0.5 cannot hold one candidate: measuring the given "
                           "configuration is predicted to take") and "give --budget-s" in line, line
    assert not out.exists() and not (tmp_path / "runs.db").exists()


@pytest.mark.usefixtures("processes")
def test_a_budget_leaves_the_confirmation_its_share(tmp_path, one_study_s):
    """Under --budget-s the search stops starting candidates once the rest of the budget is what
    the confirmation will take (its rounds at the candidates' median run): 4 candidates, but after
    the baseline and one more, 20 rounds cannot fit, so the search stops there and the confirmation
    measures what the budget allows; the winner comes from confirmed rounds. The budget is 6 of
    this machine's one-candidate studies, timed first (a study's start-up plus one run): the start-up,
    two candidates and a round or two of three runs fit it on a quiet laptop and on a loaded 2-core
    CI runner alike, and 20 rounds never do (a fixed 40 s left a loaded runner no round at all, and
    3.5 studies did once, beside a make check: the budget working, not the claim under test)."""
    out, budget = tmp_path / "tuned", round(6 * one_study_s)
    done = run(["autotune", *SMALL[:-2], "--knobs", "threads,steps_per_execution", "--trials", "4",
                "--confirm-rounds", "20", "--budget-s", str(budget), "--out", str(out),
                "--store", str(tmp_path / "runs.db")], tmp_path, OMP_NUM_THREADS="2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "searching stops here: the rest of --budget-s" in done.stdout, done.stdout[-3000:]
    assert len([r for r in _rows(out) if r["outcome"] in ("measured", "refused", "pruned")]) == 2
    assert len(_rows(out, "not tried")) == 2
    finalist, = [r for r in _rows(out) if r["confirmed"]]
    assert 1 <= len(finalist["confirmed"]) < 20
    # That it starts no run past the deadline: test_the_confirmation_starts_no_run_past_its_deadline.


@pytest.mark.usefixtures("processes")
@pytest.mark.parametrize("flags, message", [
    (["--knobs", "nosuch"], "--knobs nosuch: not a knob for this training here; it has precision, compile"),
    (["--trials", "0"], "--trials must be >= 1 (got 0)"),
    (["--window-epochs", "1"], "--window-epochs must be >= 2"),
    (["--loss-tolerance", "-1"], "--loss-tolerance must be > 0"),
    (["--lr-rule", "cubic"], "--lr-rule must be one of none, linear, sqrt"),
    (["--budget-s", "-1"], "--budget-s must be >= 0"),
    (["--prune-factor", "1"], "--prune-factor must be > 1"),
    (["--device-memory", "lots"], "--device-memory"),
    (["--objective", "time-to-target", "--config", "{tmp}/no_target.toml"], "--objective time-to-target needs a target"),
])
def test_bad_autotune_flags_are_one_line_before_anything_runs(tmp_path, flags, message):
    (tmp_path / "no_target.toml").write_text('[model]\nname = "mlp"\n[data]\nname = "digits"\n')
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    done = run_here(["autotune", "--model", "mlp", "--data", "digits", "--out", str(tmp_path / "t"),
                     "--store", str(tmp_path / "runs.db"), *flags], tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "t" / "trials").exists()


@pytest.mark.usefixtures("processes")
def test_time_to_target_searches_the_batch_size_with_its_learning_rate_rule(tmp_path):
    out = tmp_path / "tuned"
    done = run(["autotune", "--confirm-rounds", "0", "--objective", "time-to-target", "--model", "mlp", "--model-option", "hidden=[64]",
                "--data", "digits", "--target-accuracy", "0.9", "--epochs", "20", "--lr", "0.003",
                "--batch-size", "64", "--knobs", "batch_size", "--trials", "3", "--no-progress", "--out", str(out),
                "--store", str(tmp_path / "runs.db")], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = _result(out)
    assert result["objective"] == "time-to-target"
    rows = {r["params"]["batch_size"]: r for r in _rows(out, "measured")}
    assert set(rows) == {32, 64, 128} and all(0 < r["value"] for r in rows.values())
    assert result["best"]["batch_size"] == min(rows, key=lambda b: rows[b]["value"])
    # Each candidate trained until it reached the target: its run says so, at its own batch and LR.
    store = RunStore(str(tmp_path / "runs.db"))
    for batch, row in rows.items():
        record = store.get(row["run_id"])
        assert record.summary_value("reached_target") is True
        assert record.config["batch_size"] == batch
        assert record.config["optim"]["lr"] == pytest.approx(0.003 * (batch / 64) ** 0.5)   # the sqrt rule
    store.close()


@pytest.mark.usefixtures("processes")
def test_time_to_target_is_confirmed_over_seeds_with_the_test_metric(tmp_path):
    """Under time to target the confirmation's rounds are seeds: the given configuration and the
    finalist trained whole, interleaved, seed by seed; each finalist carries its median test-metric
    difference, and a winner must keep the test metric (the refusal itself: the test above)."""
    out = tmp_path / "tuned"
    done = run(["autotune", "--objective", "time-to-target", "--model", "mlp", "--model-option", "hidden=[64]",
                "--data", "digits", "--target-accuracy", "0.9", "--epochs", "20", "--lr", "0.003", "--seed", "7",
                "--batch-size", "64", "--knobs", "batch_size", "--trials", "2", "--confirm-rounds", "2",
                "--finalists", "1", "--no-progress", "--out", str(out), "--store", str(tmp_path / "runs.db")],
               tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 interleaved rounds (seeds 7..8)" in done.stdout
    from scaletrain.config import load_toml
    seeds = sorted(load_toml(c)["seed"] for c in (out / "trials").glob("confirm-*/config.toml"))
    # Each seed: the given configuration twice (the second run is the noise floor) and the finalist.
    assert seeds == [7, 7, 7, 8, 8, 8]
    finalist, = [r for r in _rows(out) if r["confirmed"]]
    assert len(finalist["confirmed"]) == 2 and finalist["test_delta"] is not None
    best = _result(out)["best"]
    assert best == (finalist["params"] if finalist["wins"] else _result(out)["baseline"])


def test_a_search_measures_the_baseline_and_each_knob_alone_first():
    """Each knob is judged alone against the given configuration before the sampler combines them,
    precision first, the lever the seeds name first ("up to 3x"): a 4-trial search of char-gpt's 12
    candidates missed bf16-true, 25 % faster, when TPE chose after the baseline alone; under load no
    1-thread candidate ran without a precision the loss check refused (issue 64)."""
    from scaletrain.experiments.autotune.knobs import Knob, candidates, first_candidates
    knobs = [Knob("compile", (False, True)), Knob("threads", (2, 1)),
             Knob("precision.policy", ("fp32", "bf16-mixed", "bf16-true"), numerics=True, first=True)]
    grid = candidates(knobs)
    first = first_candidates(knobs, grid)
    base = {"compile": False, "threads": 2, "precision.policy": "fp32"}
    assert first == [base, {**base, "precision.policy": "bf16-mixed"}, {**base, "precision.policy": "bf16-true"},
                     {**base, "compile": True}, {**base, "threads": 1}]
    kept = [c for c in grid if c["precision.policy"] != "bf16-mixed"]   # one discarded by the planner
    assert [c["precision.policy"] for c in first_candidates(knobs, kept)] == ["fp32", "bf16-true", "fp32", "fp32"]


def test_precisions_the_device_only_emulates_are_discarded_before_anything_runs():
    """bf16 without bfloat16 units is float32 converted inside every kernel: a bf16-mixed candidate
    of the default recipe took over 20x the fp32 one's time on a CPU without avx512_bf16."""
    from scaletrain.experiments.autotune.knobs import emulated_precisions
    from scaletrain.precision.hardware import DeviceFacts
    plain_cpu = DeviceFacts("cpu", "cpu", cpu_flags=frozenset({"avx2", "fma"}))
    emulated = emulated_precisions("fp32", plain_cpu)
    assert {"bf16-mixed", "bf16-true"} <= set(emulated) and "fp32" not in emulated
    assert "no bfloat16 instructions" in emulated["bf16-mixed"]
    bf16_cpu = DeviceFacts("cpu", "cpu", cpu_flags=frozenset({"avx512f", "avx512_bf16"}))
    assert not {"bf16-mixed", "bf16-true"} & set(emulated_precisions("fp32", bf16_cpu))
    assert "bf16-mixed" not in emulated_precisions("bf16-mixed", plain_cpu)   # the baseline is always measured
    assert "bf16-mixed" in emulated_precisions("fp32", DeviceFacts("cuda", "V100", capability=(7, 0)))
    assert emulated_precisions("fp32", DeviceFacts("cuda", "H100", capability=(9, 0))) == {}


@pytest.mark.usefixtures("processes")
def test_the_given_configuration_runs_on_the_callers_threads(tmp_path):
    """The baseline is what the caller runs: on one thread (OMP_NUM_THREADS=1, as this shell), not
    the whole machine the candidates' slot holds; the machine's other thread count is the knob's
    other value, and best.toml states the winner's count."""
    out = tmp_path / "tuned"
    done = run(["autotune", *SMALL, "--knobs", "threads", "--trials", "2", "--out", str(out),
                "--store", str(tmp_path / "runs.db")], tmp_path, OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stdout + done.stderr
    result = _result(out)
    assert result["baseline"] == {"threads": 1}                        # the given configuration: the caller's
    assert result["knobs"]["threads"] == [1, len(os.sched_getaffinity(0))]   # the machine's count is the other
    assert {r["params"]["threads"] for r in result["rows"] if r["trial"] == 0} == {1}   # measured first


def test_time_to_target_searches_the_batch_size_whatever_knobs_names(tmp_path):
    """The batch size is what time to target is about: `--knobs threads` under that objective
    still searches it (docs/autotune.md says so); under throughput `--knobs` is the whole space."""
    from rich.console import Console

    from scaletrain.config import DataConfig, ModelConfig, TrainConfig
    from scaletrain.experiments.autotune.search import AutoTuner
    from scaletrain.experiments.autotune.settings import OBJECTIVES, AutotuneSettings
    cfg = TrainConfig(model=ModelConfig(name="mlp"), data=DataConfig(name="digits"), batch_size=64, target=0.9,
                      target_metric="accuracy", device="cpu")
    for objective, labels in (("time-to-target", ["batch_size", "threads"]), ("throughput", ["threads"])):
        settings = AutotuneSettings(out=tmp_path / objective, trials=2, only=("threads",),
                                    objective=OBJECTIVES[objective])
        tuner = AutoTuner(cfg, settings, Console(quiet=True))
        assert [k.label for k in tuner.knobs] == labels


@pytest.mark.usefixtures("processes")
def test_a_hopeless_candidate_is_stopped_at_its_cap(tmp_path):
    """A candidate that runs longer than --cap-factor times the baseline's whole run is stopped and
    recorded as such (its run ended, not left running); the search goes on and reports the best.
    The `threads = 1` candidate's model sleeps a minute in its first step (a model slow on purpose)."""
    out = tmp_path / "tuned"
    done = run(["autotune", *SMALL, "--model", "faulty_models:single_thread_hangs_mlp", "--knobs", "threads",
                "--trials", "2", "--cap-factor", "2", "--out", str(out), "--store", str(tmp_path / "runs.db")],
               tmp_path, OMP_NUM_THREADS="2")
    assert done.returncode == 0, done.stdout + done.stderr
    measured, stopped = _rows(out, "measured"), _rows(out, "stopped")
    assert [r["params"]["threads"] for r in measured] == [2]
    # Stopped, so not measured: left alone, the sleeping candidate would have ended its minute and been.
    assert [r["params"]["threads"] for r in stopped] == [1]
    assert "ran past 2x the baseline's" in stopped[0]["why"]
    assert _result(out)["best"] == {"threads": 2}
    store = RunStore(str(tmp_path / "runs.db"))
    assert store.get(stopped[0]["run_id"]).status == "failed"
    store.close()


@pytest.mark.usefixtures("processes")
def test_a_candidate_far_slower_than_the_best_is_stopped_within_an_epoch(tmp_path):
    """The `threads = 1` candidate passes the trainer's warm-up at full speed, then sleeps half a
    second in every training forward (a model slow on purpose): below the best so far /
    --prune-factor, it is stopped a second or so into its first epoch of 20 steps (10 s of
    sleeping otherwise), recorded as pruned with its measured speed, and the search goes on."""
    out = tmp_path / "tuned"
    done = run(["autotune", *SMALL[:-7], "--steps", "20", "--window-epochs", "2", "--confirm-rounds", "0", "--no-progress",
                "--model", "faulty_models:single_thread_slows_mlp", "--model-option", "after_calls=1",
                "--knobs", "threads", "--trials", "2", "--out", str(out), "--store", str(tmp_path / "runs.db")],
               tmp_path, OMP_NUM_THREADS="2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    pruned, = _rows(out, "pruned")
    assert pruned["params"]["threads"] == 1
    steps = int(re.search(r"stopped after (\d+) steps at [\d.]+ samples/s, below the floor of [\d.]+ "
                          r"\(the best so far / --prune-factor 3\)", pruned["why"]).group(1))
    assert 2 <= steps < 20, pruned["why"]          # within the first epoch, not at its end
    assert _result(out)["best"] == {"threads": 2}
    log = (out / "trials" / f"trial-{pruned['trial']:04d}" / "train.log").read_text()
    assert "below the floor" in log


def test_precisions_the_device_only_emulates_are_skipped_unless_asked(tmp_path):
    """On a device without 16-bit units a bf16 candidate is float32 converted in every kernel,
    slower by construction: discarded with the reason before anything runs, unless
    --emulated-precisions asks for it."""
    from rich.console import Console

    from scaletrain.config import DataConfig, ModelConfig, TrainConfig
    from scaletrain.experiments.autotune.knobs import emulated_precisions
    from scaletrain.experiments.autotune.search import AutoTuner
    from scaletrain.experiments.autotune.settings import AutotuneSettings
    from scaletrain.precision.hardware import device_facts
    cfg = TrainConfig(model=ModelConfig(name="mlp"), data=DataConfig(name="digits"), batch_size=64, device="cpu")
    emulated = emulated_precisions("fp32", device_facts(torch_cpu()))
    for forced in (False, True):
        settings = AutotuneSettings(out=tmp_path / str(forced), trials=2, only=("precision",), emulated=forced)
        tuner = AutoTuner(cfg, settings, Console(quiet=True))
        tried = set(next(k.values for k in tuner.knobs if k.label == "precision")) & set(emulated)
        if not tried:
            pytest.skip("this CPU computes every precision searched (bfloat16 instructions): nothing is emulated")
        kept, discarded = tuner.plan()
        assert {row.params["precision.policy"] for row in discarded} == (set() if forced else tried)
        assert {p["precision.policy"] for p in kept} & tried == (tried if forced else set())


def torch_cpu():
    import torch
    return torch.device("cpu")


def test_interleaved_rounds_rotate_the_order_and_a_finalist_wins_only_every_round():
    from scaletrain.training.rounds import Measured, confirm, interleave
    assert interleave(["A", "B", "C"], 4) == [["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"], ["A", "B", "C"]]
    speeds = {("A", 0): 100, ("B", 0): 150, ("C", 0): 120, ("A", 1): 100, ("B", 1): 140, ("C", 1): 90,
              ("A", 2): 100, ("B", 2): 130, ("C", 2): 110}
    found = confirm("A", ["B", "C"], 3, lambda key, r: Measured(speeds[key, r]), lambda v, b: v / b, noise=False)
    assert found["B"].ratios == [1.5, 1.4, 1.3] and found["B"].wins and found["B"].median == 1.4
    assert found["C"].ratios == [1.2, 0.9, 1.1] and not found["C"].wins      # lost one round: a tie
    assert not found["C"].slower and not found["B"].slower
    behind = confirm("A", ["C"], 2, lambda key, r: Measured(speeds["A", r] * (0.7 if key == "C" else 1)),
                     lambda v, b: v / b, noise=False)["C"]
    assert behind.slower and not behind.wins     # lost every round: slower, not a tie
    assert found["C"].describe() == "1.10x (0.90-1.20, 3 rounds)"
    # Time to target: faster every seed, but its test accuracy a point lower: refused.
    tests = {"A": 0.95, "B": 0.94, "C": 0.95}
    found = confirm("A", ["B"], 3, lambda key, r: Measured(speeds[key, r], tests[key]), lambda v, b: v / b,
                    test_tolerance=0.005, noise=False)
    assert found["B"].low > 1 and found["B"].loses_test and not found["B"].wins


def test_the_confirmation_starts_no_run_past_its_deadline(monkeypatch):
    """Each run takes 10 s on a stubbed clock and the deadline is at 25 s: the runs starting at 0,
    10 and 20 s run (the last overruns the deadline, as a run under way may), none at 30 s."""
    from scaletrain.training import rounds as module
    now = [0.0]
    monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    started = []

    def measure(key, r):
        started.append((key, r, now[0]))
        now[0] += 10.0
        return module.Measured(100.0)
    module.confirm("A", ["B"], 5, measure, lambda v, b: v / b, deadline=25.0, noise=False)
    assert started == [("A", 0, 0.0), ("B", 0, 10.0), ("B", 1, 20.0)]


def test_the_noise_floor_is_the_given_configuration_against_itself_and_a_win_inside_it_is_a_tie():
    """Each round runs the given configuration twice (confirm.AGAIN). B beat it in every round by
    6-8 %, but the given configuration read up to 12 % apart from itself: a tie. D's 40 % is beyond."""
    from scaletrain.training.rounds import AGAIN, Measured, confirm
    speeds = {"A": [100, 100, 100], AGAIN: [112, 95, 104], "B": [107, 106, 108], "D": [140, 141, 139]}
    order = []

    def measure(key, r):
        order.append(key)
        return Measured(speeds[key][r])
    found = confirm("A", ["B", "D"], 3, measure, lambda v, b: v / b)
    assert order[:4] == ["A", "B", "D", AGAIN] and order.count(AGAIN) == 3     # interleaved like any contestant
    noise = found["B"].noise
    assert noise is found["D"].noise and noise.ratios == [1.12, 0.95, 1.04]
    assert found["B"].low > 1 and not found["B"].beyond_noise and not found["B"].wins
    assert found["D"].beyond_noise and found["D"].wins


def test_a_slow_contestant_is_confirmed_over_about_ten_seconds_not_all_its_steps():
    """MEASURE.md's window: 50 steps, or 10 s. At 140 samples/s (a loaded machine's two threads) 25
    steps of 128 take 23 s an epoch; the confirmation measures it over about 10 s of steps instead,
    never fewer than MIN_STEPS; a fast or unmeasured one keeps every step."""
    from scaletrain.training.rounds import MIN_STEPS, WINDOW_S, window_steps
    assert WINDOW_S == 10.0
    assert window_steps(140.0, 128, 25, 2) == 6                  # 6 steps x 2 epochs x 128 / 140 = 11 s
    assert window_steps(3000.0, 128, 25, 2) == 25                # 50 steps in 2 s: all of them
    assert window_steps(None, 128, 25, 2) == window_steps(float("nan"), 128, 25, 2) == 25
    assert window_steps(10.0, 128, 25, 2) == MIN_STEPS
    assert window_steps(10.0, 128, 2, 2) == 2                    # never more than asked


@pytest.mark.usefixtures("processes")
def test_a_confirmation_run_that_crawls_is_stopped_at_the_floor_and_counts_its_speed(tmp_path):
    """The third training process (the given configuration's first confirmation run) crawls, each
    training forward sleeping 0.2 s: below the fastest contestant's speed / --prune-factor it is
    stopped a second or so in (40 sleeping steps otherwise), recorded as pruned, and the speed it
    trained at is its figure for the round: the finalist beat it by more than the factor. The given
    configuration's second run of the round (the noise floor) did not crawl, so it read about as far
    from its first as the finalist did: the finalist wins only if its ratio is above the floor's,
    and only in three rounds beyond the noise: one round is inconclusive (the rule's own cases are
    test_the_noise_floor_is_the_given_configuration_against_itself_and_a_win_inside_it_is_a_tie,
    with fixed speeds)."""
    out = tmp_path / "tuned"
    done = run(["autotune", *SMALL[:-7], "--steps", "20", "--window-epochs", "2", "--no-progress",
                "--model", "faulty_models:loaded_mlp", "--model-option", f"counter={tmp_path / 'load'}",
                "--model-option", "slow_process=3", "--model-option", "delay_s=0.2", "--knobs", "grad_accum_steps",
                "--trials", "2", "--finalists", "1", "--confirm-rounds", "1",
                # (no budget, so no pilot: its steps in this process would count as a process here)
                "--budget-s", "0", "--out", str(out), "--store", str(tmp_path / "runs.db")], tmp_path, OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (out / "trials" / "confirm-0-0" / "train.log").read_text()
    assert "below the floor" in log, log[-2000:]
    finalist, = [r for r in _rows(out) if r["confirmed"]]
    assert len(finalist["confirmed"]) == 1 and finalist["confirmed"][0] > 3, finalist
    noise, = _result(out)["noise_floor"]
    assert noise > 3
    # One round cannot make the three a verdict needs beyond the noise: inconclusive, whichever ran faster.
    assert finalist["wins"] is False
    assert "a tie, inconclusive (beyond the noise floor in" in done.stdout and "3 needed" in done.stdout, \
        done.stdout[-3000:]


@pytest.mark.usefixtures("processes")
def test_a_winner_picked_by_the_machines_load_is_reported_as_a_tie(tmp_path):
    """Every second training process runs on a loaded machine (faulty_models.loaded_mlp): the
    search measured the given configuration loaded and the candidate not, and saw the candidate
    several times faster. Interleaved, the candidate loses a round: a tie, the given configuration
    stays the winner, and the table says so."""
    out = tmp_path / "tuned"
    done = run(["autotune", *SMALL[:-2], "--model", "faulty_models:loaded_mlp", "--model-option",
                f"counter={tmp_path / 'load'}", "--knobs", "grad_accum_steps", "--trials", "2", "--confirm-rounds", "3",
                "--budget-s", "0",    # (no pilot: its steps in this process would count as a process here)
                "--out", str(out), "--store", str(tmp_path / "runs.db")], tmp_path, OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = _result(out)
    given, = [r for r in result["rows"] if r["params"] == result["baseline"]]
    finalist, = [r for r in result["rows"] if r["confirmed"]]
    assert finalist["value"] > 1.5 * given["value"]          # what the search alone would have crowned
    assert len(finalist["confirmed"]) == 3 and min(finalist["confirmed"]) < 1 < max(finalist["confirmed"])
    assert finalist["wins"] is False and result["best"] == result["baseline"]
    assert "tie" in done.stdout and ("confirming: the given configuration (twice a round: the noise floor) and 1 "
                                     "finalist(s), 3 interleaved rounds") in done.stdout
    # confirm-R-0 is the given configuration in every round (the folders docs/autotune.md names).
    from scaletrain.config import load_toml
    given_runs = sorted((out / "trials").glob("confirm-*-0/config.toml"))
    assert len(given_runs) == 3
    for config in given_runs:
        assert load_toml(config)["optim"].get("grad_accum_steps", 1) == given["params"]["optim.grad_accum_steps"]


def test_studies_of_one_name_in_two_folders_never_share_a_store_group(tmp_path):
    from scaletrain.experiments.autotune.settings import study_group
    store = str(tmp_path / "runs" / "runs.db")
    assert study_group("autotune", tmp_path / "runs" / "autotune" / "autotune", store) == "autotune-autotune"
    a, b = study_group("autotune", tmp_path / "a", store), study_group("autotune", tmp_path / "b", store)
    assert a != b and a.startswith("autotune-autotune-") and study_group("autotune", tmp_path / "a", store) == a


def test_the_knobs_most_likely_to_matter_are_measured_first(tmp_path):
    """Precision, compile, then on a CPU the thread count (issue 95): a search cut short by its
    budget has measured those."""
    from rich.console import Console

    from scaletrain.config import DataConfig, ModelConfig, TrainConfig
    from scaletrain.experiments.autotune.knobs import first_candidates
    from scaletrain.experiments.autotune.search import AutoTuner
    from scaletrain.experiments.autotune.settings import AutotuneSettings
    cfg = TrainConfig(model=ModelConfig(name="mlp"), data=DataConfig(name="digits"), batch_size=64, device="cpu")
    tuner = AutoTuner(cfg, AutotuneSettings(out=tmp_path / "t", trials=2), Console(quiet=True))
    labels = [k.label for k in tuner.knobs]
    assert labels[1:3] == ["compile", "threads"] and "precision" in labels
    order = first_candidates(tuner.knobs, tuner.plan()[0])
    changed = [next(k.label for k in tuner.knobs if c[k.key] != order[0][k.key]) for c in order[1:]]
    firsts = list(dict.fromkeys(changed))
    # A CPU without bfloat16 discards every 16-bit candidate before anything runs: no precision row.
    expected = ["precision", "compile", "threads"] if "precision" in firsts else ["compile", "threads"]
    assert firsts[:len(expected)] == expected, firsts
