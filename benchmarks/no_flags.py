"""No flags against the peers' defaults and the best setting named, as whole runs (issue 95, item 7).

Every side is a fresh Python process, timed by this parent from its start to its exit: what a user
waits for, the imports, the data, scaletrain's probe and every evaluation included. Sides run in
turn, the order rotating with each round (A B C D E, B C D E A, ...):

    no flags          `scaletrain train` with nothing named but the workload: the probe decides,
                      from an empty cache each time (its whole cost; the data set's cache shared);
    tutorial          the loop as PyTorch's tutorials write it: DataLoader(TensorDataset,
                      shuffle=True), torch.optim.AdamW, OneCycleLR, torch's own thread count, a
                      validation pass after each epoch;
    Lightning         `L.Trainer(max_epochs=N)` with its defaults (fp32, its logger, checkpoints,
                      progress bar, sanity check) on the same module, loaders and schedule;
    fp32 named,
    bf16-mixed named  `scaletrain train --precision ...`: the best single setting a user could name
                      is the faster of the two (compile is left out: on this CPU it never repaid
                      its compile at these lengths, BENCHMARKS.md).

The same model, initial weights (seed 0), data, batch, AdamW and one-cycle schedule on every side.
A round's ratio is no flags' wall time over the other side's (below 1: no flags is faster).

    python benchmarks/no_flags.py --case default-recipe --rounds 3
    python benchmarks/no_flags.py --case wide-mlp --rounds 3
    python benchmarks/no_flags.py --case convnet --rounds 5 --sides "fp32 named,bf16-mixed named"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.step_cost import Case, _dataset, _loss, _model, _normalised, cpu_name, lightning_module  # noqa: E402

CASES = {
    # The default recipe as `scaletrain train` runs it with no flags (recipes/mnist1d-cnn.toml).
    "default-recipe": Case("cnn1d", "mnist1d", 128, 6, 0.01, 0.05),
    "wide-mlp": Case("mlp", "mnist1d", 128, 20, 0.001, 0.05, {"hidden": [2048, 2048]}),
    "small-gpt": Case("gpt", "char-corpus", 16, 2, 0.003, 0.01, {"dim": 256, "depth": 4},
                      {"seq_len": 64, "train_subset": 4800}),
    "convnet": Case("wrn-16-4", "digits", 64, 25, 0.003, 0.05),
    # The GPU kit's (benchmarks/gpu/no_flags.py): WRN-16-10 on synthetic 28x28x1 images, 1,200
    # steps of 512; and its rehearsal's toy size.
    "wrn-16-10": Case("wrn-16-10", "synthetic", 512, 48, 0.001, 0.0005, {}, {"shape": [1, 28, 28], "num_samples": 512 * 25}),
    "wrn-toy": Case("wrn-10-1", "synthetic", 32, 3, 0.001, 0.0005, {}, {"shape": [1, 12, 12], "num_samples": 32 * 5}),
}


# ------------------------------------------------------------------------------ the children
def _device():
    import torch
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _val_accuracy(model, ds) -> float:
    """The validation split's accuracy (per token for a language model), as scaletrain reports it:
    a pass over it in batches of 256, on the model's device."""
    import torch
    device = next(model.parameters()).device
    val = ds.val if ds.val is not None else ds.test
    x, y = _normalised(ds, val), val.y
    model.eval()
    with torch.no_grad():
        right = sum(int((model(x[i:i + 256].to(device)).argmax(-1).cpu() == y[i:i + 256]).sum())
                    for i in range(0, len(y), 256))
    model.train()
    return right / y.numel()


def child_tutorial(case: Case) -> dict:
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    ds = _dataset(case)
    device = _device()
    model, loss_of = _model(case, ds).to(device), _loss(case)
    loader = DataLoader(TensorDataset(_normalised(ds, ds.train), ds.train.y), batch_size=case.batch, shuffle=True)
    opt = torch.optim.AdamW(model.parameters(), lr=case.lr, weight_decay=case.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=case.lr, total_steps=len(loader) * case.epochs)
    for _ in range(case.epochs):
        for xb, yb in loader:
            loss = loss_of(model(xb.to(device)), yb.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        accuracy = _val_accuracy(model, ds)    # the tutorial's validation pass after each epoch
    return {"val_accuracy": accuracy}


def child_lightning(case: Case) -> dict:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    ds = _dataset(case)
    net, loss_of = _model(case, ds), _loss(case)
    val = ds.val if ds.val is not None else ds.test
    train = DataLoader(TensorDataset(_normalised(ds, ds.train), ds.train.y), batch_size=case.batch, shuffle=True)
    valid = DataLoader(TensorDataset(_normalised(ds, val), val.y), batch_size=256)

    class Module(lightning_module(net, loss_of)):
        def validation_step(self, batch, i):
            self.log("val_loss", loss_of(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=case.lr, weight_decay=case.weight_decay)
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=case.lr, total_steps=len(train) * case.epochs)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    with tempfile.TemporaryDirectory() as root, contextlib.redirect_stdout(sys.stderr):
        trainer = L.Trainer(max_epochs=case.epochs, default_root_dir=root)
        trainer.fit(Module(), train, valid)
    return {"val_accuracy": _val_accuracy(net, ds)}


CHILDREN = {"tutorial": child_tutorial, "Lightning": child_lightning}


# ------------------------------------------------------------------------------ the parent
def sides() -> dict[str, list[str] | str]:
    """Each side: scaletrain's flags beside the workload (a list), or a child of this file (its name)."""
    return {"no flags": [], "tutorial": "tutorial", "Lightning": "Lightning",
            "fp32 named": ["--precision", "fp32"], "bf16-mixed named": ["--precision", "bf16-mixed"]}


def workload(case_name: str) -> list[str]:
    if case_name == "default-recipe":
        return ["--recipe", "mnist1d-cnn"]
    return CASES[case_name].cli()


def run_side(case_name: str, side: list[str] | str) -> dict:
    with tempfile.TemporaryDirectory() as root:
        # The probe's cache empty each time (its whole cost); the data set's cache shared.
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(root) / "cache"),
               "SCALETRAIN_CACHE_DIR": os.environ.get("SCALETRAIN_CACHE_DIR",
                                                      str(Path.home() / ".cache" / "scaletrain"))}
        if isinstance(side, str):
            cmd = [sys.executable, __file__, "--child", side, "--case", case_name]
        else:
            cmd = [sys.executable, "-m", "scaletrain", "train", *workload(case_name), "--no-progress",
                   "--run-dir", str(Path(root) / "run"), "--store", str(Path(root) / "runs.db"), *side]
        started = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode:
            raise RuntimeError(f"{cmd} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        if isinstance(side, str):
            return {"wall_s": wall, **json.loads(done.stdout.strip().splitlines()[-1])}
        summary = json.loads((Path(root) / "run" / "summary.json").read_text())
        said = next((line for line in done.stdout.splitlines() if line.startswith("settings:")), "")
        return {"wall_s": wall, "precision": summary["precision"], "probe_s": summary.get("probe_s"),
                "val_accuracy": summary.get("final_val_accuracy"), "test_accuracy": summary.get("test_accuracy"),
                "said": said.split(";")[0]}


def spread(values: list[float], fmt: str = ".3f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def compare(case_name: str, rounds: int, only: list[str] | None = None) -> None:
    import torch
    arms = {name: side for name, side in sides().items() if not only or name in only}
    names = list(arms)
    found: dict[str, list[dict]] = {n: [] for n in names}
    loads = []
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            loads.append(os.getloadavg()[0])
            time.sleep(0.3)
            result = run_side(case_name, arms[name])
            found[name].append(result)
            print(json.dumps({"round": r, "side": name, **result}), flush=True)
    case = CASES[case_name]
    print(f"\n## {case_name}: {case.model} {case.options or ''} on {case.data}, batch {case.batch}, {case.epochs} "
          f"epochs; whole processes, {rounds} rounds")
    print(f"# {cpu_name()}, torch {torch.__version__}, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}, 1-min load {min(loads):.2f}-{max(loads):.2f}")
    for n in names:
        ran = sorted({x.get("precision", "fp32 (its own)") for x in found[n]})
        print(f"{n:17s} wall {spread([x['wall_s'] for x in found[n]], '.2f')} s; ran {', '.join(ran)}; val accuracy "
              f"{spread([x['val_accuracy'] for x in found[n]])}")
    best = min((n for n in ("fp32 named", "bf16-mixed named") if n in found), key=lambda n: statistics.median(x["wall_s"] for x in found[n]))
    for n in names[1:]:
        if n not in found or not found[n]:
            continue
        ratios = [b["wall_s"] / a["wall_s"] for a, b in zip(found[names[0]], found[n], strict=True)]
        print(f"no flags speed / {n:17s} {spread(ratios)}{'  (best named)' if n == best else ''}")
    print("no flags said: " + " | ".join(x["said"] for x in found[names[0]]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=sorted(CASES), default="default-recipe")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sides", help="a comma list of the sides to run (default: all; 'no flags' always first)")
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child](CASES[args.case])))
        return
    only = ["no flags", *[n.strip() for n in args.sides.split(",")]] if args.sides else None
    if only and set(only) - set(sides()):
        p.error(f"--sides: choose from {', '.join(sides())}")
    compare(args.case, args.rounds, only)


if __name__ == "__main__":
    main()
