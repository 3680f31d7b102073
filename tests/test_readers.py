"""Every file scaletrain reads, fed what it is not (issue 66 item 5): cut short, nested 100,000 deep,
retyped (valid JSON or TOML of the wrong shape) and random bytes. Each reader answers with one
line naming the file and exit 2: never a traceback, never code run (JSON and TOML are data; the
checkpoints' pickles: tests/test_trust.py). The real CLI, in this process."""

from __future__ import annotations

import json
import random

import pytest

from scaletrain.cli.main import main

POINT = {"strategy": "ddp", "rate_mbit": 1000, "hosts": 2, "bus_bandwidth_Bps": 1.0e8, "hop_latency_s": 1e-4,
         "measured_step_s": 0.1, "predicted_step_s": 0.11}
MANIFEST = {"format": "scaletrain-shards/1", "dataset": "digits", "task": "classification", "num_classes": 10,
            "sample_shape": [1, 8, 8], "x_dtype": "float32", "y_shape": [], "y_dtype": "int64", "stats_shape": [1],
            "mean": [0.0], "std": [1.0], "shards": [{"name": "train-0000.tar", "split": "train", "samples": 10,
                                                      "bytes": 100, "sha256": "0" * 64}]}
NESTED_JSON = "[" * 100_000 + "]" * 100_000
TRAIN = ["train", "--model", "mlp", "--epochs", "1", "--no-progress", "--no-record"]

# reader: (the file's name, how it is placed, the command that reads it, a valid body, retyped bodies)
READERS = {
    "a shard manifest": ("manifest.json", lambda t: t / "shards" / "manifest.json",
                         lambda t: [*TRAIN, "--data", "shards", "--data-dir", str(t / "shards"), "--run-dir", str(t / "r")],
                         json.dumps(MANIFEST),
                         ["[]", '{"format": 5}', json.dumps({**MANIFEST, "shards": "x"}),
                          json.dumps({**MANIFEST, "shards": [{"name": []}]}), json.dumps({**MANIFEST, "mean": "x"})]),
    "scaling --measured": ("measured.json", lambda t: t / "measured.json",
                           lambda t: ["scaling", "--measured", str(t / "measured.json")],
                           json.dumps({"points": [POINT], "environment": {}}),
                           ['{"points": "x"}', '{"points": ["x"]}', json.dumps({"points": [POINT], "environment": "s"}),
                            json.dumps({"points": [POINT], "grad_bytes": "x"}),
                            json.dumps({"points": [{**POINT, "link_bound": [1]}]}),
                            json.dumps({"points": [{**POINT, "rate_mbit": "x"}]}),
                            json.dumps({"points": [{**POINT, "latency_ms": "x"}]}),
                            json.dumps({"points": [{**POINT, "strategy": "tensor"}], "tensor_parallel": "x"}),
                            json.dumps({"points": [{**POINT, "strategy": "tensor"}],
                                        "tensor_parallel": {"allreduce_bytes": "x"}})]),
    "a TOML config": ("run.toml", lambda t: t / "run.toml",
                      lambda t: ["train", "--config", str(t / "run.toml"), "--run-dir", str(t / "r"), "--no-record"],
                      'epochs = 1\n[model]\nname = "mlp"\n[data]\nname = "digits"\n',
                      ['epochs = "x"\n', "model = 5\n", '[model]\nname = 5\n', "[data]\noptions = 5\n"]),
    "a run folder's run.json": ("run.json", lambda t: t / "r" / "run.json",
                                lambda t: [*TRAIN, "--data", "digits", "--run-dir", str(t / "r"), "--resume", "auto"],
                                json.dumps({"run_id": "abc", "status": "failed"}),
                                ["[]", '{"run_id": []}', '{"status": {}}', '{"run_id": "abc", "config_sha256": 5}']),
    "a run folder's config.json": ("config.json", lambda t: t / "r" / "config.json",
                                   lambda t: [*TRAIN, "--data", "digits", "--run-dir", str(t / "r"), "--resume", "auto"],
                                   json.dumps({"epochs": 1}),
                                   ["[]", '{"epochs": "x"}', '{"model": 5}', '{"nonsense": 1}']),
    "a checkpoint's manifest": ("COMMITTED", lambda t: t / "ck" / "step-000000005" / "COMMITTED",
                                lambda t: [*TRAIN, "--data", "digits", "--run-dir", str(t / "r"),
                                           "--resume", str(t / "ck" / "step-000000005")],
                                json.dumps({"meta": {"global_step": 5}, "files": {"x": {"size": 1, "sha256": "0"}}}),
                                ['{"meta": [], "files": {}}', '{"files": {"../x": {}}, "meta": {}}',
                                 '{"files": {"a": "s"}, "meta": {}}', '{"files": {"a": {"size": "x"}}, "meta": {}}']),
    "a checkpoint folder's owner.json": ("owner.json", lambda t: t / "ck" / "owner.json",
                                         lambda t: [*TRAIN, "--data", "digits", "--run-dir", str(t / "r"),
                                                    "--checkpoint-dir", str(t / "ck"), "--checkpoint-every", "5"],
                                         json.dumps({"run_id": "other"}),
                                         ["[]", '{"run_id": {}}', '"owner"']),
}


def _bodies(valid: str, retyped: list[str], toml: bool) -> list[tuple[str, bytes]]:
    rng = random.Random(0)
    nested = ("a = " + NESTED_JSON) if toml else NESTED_JSON
    out = [("cut short", valid.encode()[:len(valid) // 2]), ("nested", nested.encode()),
           ("random bytes", rng.randbytes(3000)), ("not UTF-8", b'{"a": "\xff\xfe"}')]
    if not toml:     # (an empty TOML file is a configuration of defaults)
        out.append(("empty", b""))
    return out + [(f"retyped {i}", body.encode()) for i, body in enumerate(retyped)]


CASES = [(reader, kind, body) for reader, (_, _, _, valid, retyped) in READERS.items()
         for kind, body in _bodies(valid, retyped, reader == "a TOML config")]


def _place(tmp_path, reader: str, body: bytes) -> list[str]:
    name, where, command, valid, _ = READERS[reader]
    target = where(tmp_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if reader == "a run folder's config.json":      # beside a run.json that names it
        (target.parent / "run.json").write_text(json.dumps({"run_id": "abc", "status": "failed"}))
    if reader == "a run folder's run.json":
        (target.parent / "config.json").write_text(json.dumps({"epochs": 1}))
    if reader == "a checkpoint's manifest":
        (target.parent / "x").write_bytes(b"0")
    target.write_bytes(body)
    return command(tmp_path)


@pytest.mark.parametrize("reader, kind, body", CASES, ids=[f"{r}: {k}" for r, k, _ in CASES])
def test_a_reader_fed_what_it_is_not_answers_in_one_line(tmp_path, monkeypatch, capsys, reader, kind, body):
    monkeypatch.chdir(tmp_path)
    argv = _place(tmp_path, reader, body)
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("scaletrain: warning")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err[-3000:])
    name = READERS[reader][0]
    # The file by its name; a checkpoint's manifest whose entries are wrong names the checkpoint and
    # the file the entry names; a config by the key that is wrong.
    assert name in lines[0] or "config key" in lines[0] or "step-000000005: the checkpoint is damaged" in lines[0], \
        lines[0]
