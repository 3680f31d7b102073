"""Denormals on the CPU: a converging 3.2 M-parameter sequence transformer (fp32, AdamW, batch 128,
4,096 samples), trained by `scaletrain train` with its default (subnormals flushed on every compute
thread: training/denormals.py) and with `--no-flush-denormal`, each a whole process, the two arms
interleaved round by round.

    python benchmarks/denormals.py --rounds 2 --epochs 10

Once the model has learned its task (every token tells the label: the loss reaches about zero
within two epochs), its gradients shrink into float32's subnormal range; a CPU that
handles those in microcode slows down then (issue 95: 0.86 s -> 7.7 s a step on a 2-core Intel Xeon,
none on an AMD EPYC). Reported per arm: the mean step time of the first two epochs and of the
last two, their ratio (late/early), the whole training time, and the final training loss; and
the keep arm's training time over the flush arm's, paired by round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCAB, CLASSES = 64, 16


class Encoder(nn.Module):
    """Token and position embeddings, a pre-norm transformer encoder, mean pooling, a linear head:
    4 layers of width 256 (feed-forward 1024) hold 3.2 M parameters."""

    def __init__(self, input_shape, num_classes, dim=256, depth=4, heads=4):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, dim)
        self.position = nn.Parameter(torch.zeros(input_shape[0], dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        return self.head(self.encoder(self.tokens(x) + self.position).mean(dim=1))


def encoder(input_shape, num_classes, **options):
    return Encoder(input_shape, num_classes, **options)


def sequences(n=4096, length=8, seed=0):
    """Token sequences whose every token tells the class (class c draws from tokens 4c..4c+3): the
    loss falls to about zero within two epochs, and the gradients after it are tiny."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = y[:, None] * (VOCAB // CLASSES) + torch.randint(0, VOCAB // CLASSES, (n, length), generator=g)
    # Torch datasets: the token ids stay integers (an (inputs, targets) pair of arrays is read as features).
    return {"train": TensorDataset(x, y), "test": TensorDataset(x[:512], y[:512])}


def one(arm: str, epochs: int, folder: Path) -> dict:
    flags = ["--no-flush-denormal"] if arm == "keep" else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "scaletrain", "train", "--model", "benchmarks.denormals:encoder", "--data",
            "benchmarks.denormals:sequences", "--precision", "fp32", "--optimizer", "adamw", "--lr", "0.001",
            "--lr-schedule", "constant", "--batch-size", "128", "--epochs", str(epochs), "--no-progress",
            "--no-record", "--run-dir", str(folder / "run"), "--summary-json", str(folder / "summary.json"), *flags]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"{arm}: scaletrain train exited {done.returncode}: {done.stderr.strip()[-600:]}")
    epochs_logged = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    per_step = [e["epoch_train_time_s"] / max(e["optimizer_steps"] - (epochs_logged[i - 1]["optimizer_steps"]
                                                                      if i else 0), 1)
                for i, e in enumerate(epochs_logged)]
    summary = json.loads((folder / "summary.json").read_text())
    early, late = statistics.mean(per_step[:2]), statistics.mean(per_step[-2:])
    return {"early_step_s": early, "late_step_s": late, "late_over_early": late / early,
            "train_s": summary["train_time_s"], "final_loss": epochs_logged[-1]["train_loss"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    from benchmarks.common import environment
    print(json.dumps(environment(torch.device("cpu"))))
    results: dict[str, list[dict]] = {"flush": [], "keep": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for arm in (("flush", "keep") if r % 2 == 0 else ("keep", "flush")):
                folder = Path(tmp) / f"{arm}-{r}"
                folder.mkdir()
                results[arm].append(one(arm, args.epochs, folder))
                print(arm, r, json.dumps({k: round(v, 4) for k, v in results[arm][-1].items()}), flush=True)
    for arm, rows in results.items():
        def show(key):
            values = [row[key] for row in rows]
            return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"
        print(f"{arm:6s} early step {show('early_step_s')} s, late step {show('late_step_s')} s, late/early "
              f"{show('late_over_early')}, training {show('train_s')} s, final loss {show('final_loss')}")
    ratios = [k["train_s"] / f["train_s"] for k, f in zip(results["keep"], results["flush"], strict=True)]
    print(f"keep/flush training time, paired by round: {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
