"""A Hugging Face model trained on its own loss through the trainer, against the loop a user writes
by hand for it, in one process, interleaved (A B, B A, A B, ...), one epoch each, the first round dropped
(warm-up): GPT-2 built from its config (random weights, nothing downloaded) on a tokenised
`datasets.Dataset` of dict rows (`input_ids`, `attention_mask`, `labels`).

  (a) scaletrain: `Trainer.fit(ds)`: no task code (the model's own `.loss`), our order, per-batch
      seeds, the batch copied to the device a batch ahead, device-side counters and LR;
  (b) hand loop: `DataLoader(ds, shuffle=True)`, `model(**batch).loss`, backward, fused AdamW.

The goal (issue 48): (a) at most 3 % over (b). Per-epoch training time as the trainer's clock
records it (`epoch_train_time_s`: its epoch's steps, data waits included, evaluation not); the
hand loop timed the same way (a synchronised clock around the epoch's steps).

  python benchmarks/hf_model.py
  python benchmarks/hf_model.py --layers 4 --width 256 --length 128
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import environment, print_epochs, spread  # noqa: E402
from scaletrain.config import OptimConfig, TrainConfig  # noqa: E402
from scaletrain.training import Trainer  # noqa: E402
from scaletrain.training.clock import synchronize  # noqa: E402


def tokenised(n: int, length: int, vocab: int, seed: int):
    import datasets
    rng = np.random.default_rng(seed)
    ids = (rng.integers(0, vocab, (n, 1)) + np.arange(length) * rng.integers(1, 4, (n, 1))) % vocab
    return datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": np.ones_like(ids).tolist(),
                                       "labels": ids.tolist()}).with_format("torch")


def gpt(layers: int, width: int, length: int, vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=length, n_embd=width, n_layer=layers,
                                      n_head=max(width // 64, 1), bos_token_id=0, eos_token_id=0,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def hand_epoch(model, opt, loader, device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for batch in loader:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    train = tokenised(args.samples, args.length, args.vocab, seed=0)
    val = tokenised(64, args.length, args.vocab, seed=1)

    cfg = TrainConfig(batch_size=args.batch_size, epochs=1, optim=OptimConfig(optimizer="adamw", lr=1e-3),
                      device=args.device, progress=False, log_every=10**9, eval_each_epoch=False)
    torch.manual_seed(0)
    trainer = Trainer(gpt(args.layers, args.width, args.length, args.vocab), cfg)
    torch.manual_seed(0)
    hand_model = gpt(args.layers, args.width, args.length, args.vocab).to(device).train()
    hand_opt = torch.optim.AdamW(hand_model.parameters(), lr=torch.tensor(1e-3, device=device), fused=True)
    hand_loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, drop_last=True,
                             pin_memory=device.type == "cuda")

    times: dict[str, list[float]] = {"scaletrain": [], "hand loop": []}
    def ours() -> None:
        trainer.history.clear()
        trainer.fit(train, val=val)
        times["scaletrain"].append(trainer.history[-1]["epoch_train_time_s"])

    def theirs() -> None:
        times["hand loop"].append(hand_epoch(hand_model, hand_opt, hand_loader, device))

    for i in range(args.repeats + 1):   # A B, B A, A B, ...: neither side always runs second
        for run in ((ours, theirs) if i % 2 == 0 else (theirs, ours)):
            run()
    times = {k: v[1:] for k, v in times.items()}   # the first round: warm-up
    env = environment(device)
    params = sum(p.numel() for p in hand_model.parameters())
    print(f"# hf model: GPT-2 {args.layers} layers x {args.width} ({params / 1e6:.2f}M params), {args.samples} "
          f"sequences of {args.length}, batch {args.batch_size}, fp32, on {env['device']}, torch {env['torch']}, "
          f"{env['date']}, {args.repeats} interleaved rounds")
    print_epochs(times)
    ratios = [a / b for a, b in zip(times["scaletrain"], times["hand loop"], strict=True)]
    r = spread(ratios)
    print(f"scaletrain / hand loop: median {r['median']:.3f} (min {r['min']:.3f}, max {r['max']:.3f}); "
          f"{statistics.median(ratios) - 1:+.1%}")


if __name__ == "__main__":
    main()
