"""The prepared GPU run (benchmarks/gpu/) rehearsed on this CPU, so it cannot rot between GPU
loans: every part runs at toy size through the code the GPU runs, writes its result file, and
a part that fails or outlives its limit costs that part alone."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from benchmarks.gpu.__main__ import main as kit_main
from tests.processes import python, python_command

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("environment", "smoke", "precision", "peers", "memory_lab", "autotune", "compiled")


def kit(out: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    # A rehearsal of code paths, not of speed: one thread a process (as the CLI tests run), so its
    # processes and the other test worker's do not fight over two cores (with two threads each,
    # its peers part ran 4x its idle time beside the suite and outlived its limit). The runner, its
    # parts (SCALETRAIN_KIT_PYTHON) and the scaletrain commands they start (smoke's CLI cases,
    # autotune) start warm, as the CLI tests' processes do (tests/processes.py).
    return python(["-m", "benchmarks.gpu", "--out", str(out), "--rehearse", *args], ROOT, timeout,
                  SCALETRAIN_KIT_PYTHON=shlex.join(python_command()))


def results(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


@pytest.mark.usefixtures("processes")
@pytest.mark.timeout(1500)   # hang guards: 3.5 minutes idle, 6.5 beside the suite
def test_rehearsal_runs_every_part_and_writes_at_most_8_files(tmp_path):
    done = kit(tmp_path, timeout=1450)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted([f"{p}.json" for p in PARTS] + ["summary.md"])   # the lease brings back 8
    found = results(tmp_path)
    for name in PARTS:
        r = found[name]
        assert r["status"] == "passed", (name, r.get("error"), r.get("output_tail", "")[-2000:])
        assert r["rehearsal"] is True and r["notes"].get("unreached", []) == []
        failed = [(row["case"], row.get("error")) for row in r["rows"] if row["status"] == "failed"]
        assert not failed, (name, failed)
        assert r["rows"], name
    # The training paths a CPU can take ran, not skipped: every precision, fusing, the streaming
    # loader, checkpointing, ddp and fsdp on one rank, and the CLI end to end.
    smoke = {row["case"]: row for row in found["smoke"]["rows"]}
    ran = [c for c, row in smoke.items() if row["status"] == "passed"]
    assert {"fp32", "bf16-mixed", "fp16-mixed (dynamic loss scale)", "bf16-true", "activation checkpointing",
            "fused steps (4 per call), no graph", "streaming loader, pinned, 2 workers", "ddp on one rank",
            "fsdp on one rank", "cli: train with checkpoints", "cli: resume", "cli: export pt2",
            "cli: predict"} <= set(ran)
    assert smoke["CUDA-graph fused steps (4 per call)"] == {**smoke["CUDA-graph fused steps (4 per call)"],
                                                           "status": "skipped", "error": "no CUDA"}
    # Figures are figures: positive rates, the planner's prediction beside a measured peak.
    precision = [row for row in found["precision"]["rows"] if row["status"] == "passed"]
    assert len(precision) == 5 and all(row["images_per_sec"] > 0 and row["min"] <= row["images_per_sec"]
                                       <= row["max"] for row in precision)
    memory = [row for row in found["memory_lab"]["rows"] if row["status"] == "passed"]
    assert len(memory) == 9 and all(row["measured_mib"] > 0 and row["predicted_mib"] > 0 for row in memory)
    # Both peer tables, every side of each: no flags (each tool's defaults) and equal settings.
    peers = found["peers"]["rows"]
    for kind in ("no flags", "equal settings"):
        rows = [row for row in peers if row.get("kind") == kind]
        assert sorted(row["side"] for row in rows) == ["Lightning", "hand loop", "scaletrain"]
        assert all(row["status"] == "passed" and 0 < row["min"] <= row["images_per_sec"] <= row["max"] for row in rows)
    recipe = [row for row in peers if row.get("kind") == "time to 94 %"]
    assert [row["status"] for row in recipe] == ["passed"] * 3
    assert all(0 < row["final_val_accuracy"] <= 1 for row in recipe)
    trials = [row for row in found["autotune"]["rows"] if row["case"] == "trial"]
    assert len(trials) == 2 and found["autotune"]["rows"][0]["best"].startswith("best:")
    summary = (tmp_path / "summary.md").read_text()
    assert all(f"## {name}: passed" in summary for name in PARTS)


@pytest.mark.usefixtures("processes")
def test_a_failing_part_and_a_part_past_its_limit_cost_only_themselves(tmp_path):
    # smoke hangs once it has listed its cases, so its limit is what stops it, whatever the load.
    # Listing them takes a part's start (its process, warm here): the limit is 5 times what the
    # environment part (a start and a matrix product) took just now, 12 to 40 s (a fixed 40 s left
    # a loaded CPU room; on a quiet AVX-512 one the cold environment part took 1.4-2.4 s, and the
    # test waited 40, then, at 8 times it, up to 19).
    probe = kit(tmp_path / "probe", "--parts", "environment", timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    limit = round(min(40.0, max(12.0, 5 * results(tmp_path / "probe")["environment"]["seconds"])))
    out = tmp_path / "out"
    done = kit(out, "--parts", "environment,smoke,compiled", "--fail", "environment", "--hang", "smoke",
               "--limit", f"smoke={limit}", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = results(out)
    assert found["environment"]["status"] == "failed"
    assert "failure injected into part environment" in found["environment"]["error"]
    assert "RuntimeError" in found["environment"]["output_tail"]   # its traceback came back with it
    smoke = found["smoke"]
    assert smoke["status"] == "timed out" and smoke["error"] == f"stopped at its {limit} s limit"
    assert "cli: resume" in smoke["notes"]["unreached"], "a part stopped at its limit lists what it did not reach"
    assert found["compiled"]["status"] == "passed"   # the part after both still ran (its shortest on a CPU)
    summary = (out / "summary.md").read_text()
    assert "| environment | failed |" in summary and "| smoke | timed out |" in summary


def test_bad_arguments_are_one_line_before_any_part_runs(tmp_path):
    (tmp_path / "file").write_text("")
    for args, message in ((["--parts", "nosuch"], "unknown part 'nosuch'"),
                          (["--limit", "smoke"], "--limit takes PART=SECONDS"),
                          (["--out", str(tmp_path / "file")], "is a file, not a folder")):
        out = [] if "--out" in args else ["--out", str(tmp_path / "out")]
        with contextlib.redirect_stderr(io.StringIO()) as stderr, pytest.raises(SystemExit) as ended:
            kit_main([*out, *args])   # the runner's own main: argparse's exit, as the command ends
        assert ended.value.code == 2 and message in stderr.getvalue(), stderr.getvalue()
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("processes")
@pytest.mark.timeout(600)
def test_the_extra_parts_are_a_call_of_their_own_and_rehearse_every_side(tmp_path):
    done = kit(tmp_path, "--parts", "no_flags,fp8", timeout=550)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp8.json", "no_flags.json", "summary.md"]
    fp8 = results(tmp_path)["fp8"]
    assert fp8["status"] == "passed", (fp8.get("error"), fp8.get("output_tail", "")[-2000:])
    assert [(r["case"], r["status"]) for r in fp8["rows"]] == [
        ("toy GPT: bf16-mixed", "passed"), ("toy GPT: fp8 tensorwise", "passed"), ("toy GPT: fp8 rowwise", "passed"),
        ("toy GPT: fp8 measured", "passed")]
    assert all(r["tokens_per_sec"] > 0 for r in fp8["rows"]) and fp8["rows"][1]["emulated"] is True
    assert set(fp8["notes"]["fp8_speed_over_bf16"]["toy GPT"]) == {"fp8 tensorwise", "fp8 rowwise", "fp8 measured"}
    assert "32x32" in fp8["rows"][3]["shapes_measured"]    # each shape's verdict, in its row
    found = results(tmp_path)["no_flags"]
    assert found["status"] == "passed", (found.get("error"), found.get("output_tail", "")[-2000:])
    rows = {row["case"]: row for row in found["rows"]}
    assert list(rows) == ["no flags", "bf16-mixed named", "tutorial", "Lightning"]
    assert all(row["status"] == "passed" and row["wall_s"] > 0 and 0 <= row["val_accuracy"] <= 1
               for row in rows.values()), rows
    assert rows["no flags"]["said"].startswith("settings: precision ") and rows["bf16-mixed named"]["precision"] == "bf16-mixed"
    assert set(found["notes"]["no_flags_speed_over"]) == {"bf16-mixed named", "tutorial", "Lightning"}
