"""`scaletrain predict RUN_ID`: the run's predictions for new samples or one of its splits, with
--nproc N computed by the replicas of N processes side by side (see inference/predict.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from scaletrain.cli.flags import add_number, add_trust_code
from scaletrain.tracking.store import DEFAULT_STORE


def add_predict_arguments(parser: argparse.ArgumentParser) -> None:
    add_trust_code(parser)
    from scaletrain.cli.train import add_train_arguments
    from scaletrain.config import TrainConfig
    from scaletrain.options import training_only_keys
    parser.add_argument("run_id", metavar="RUN_ID", help="a run with a saved model (model.pt)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", metavar="FILE.npy", help="samples shaped like the run's data (numpy.save)")
    source.add_argument("--split", choices=("train", "val", "test"), help="a split of the run's own data set")
    parser.add_argument("--out", required=True, metavar="FILE.npy", help="where the predictions go (a new file)")
    add_number(parser, "--batch-size", int, ge=1, default=None, dest="forward_batch",
               help="samples per forward (default: the run's)")
    parser.add_argument("--store", default=str(DEFAULT_STORE), help=f"the run store (default {DEFAULT_STORE})")
    parser.add_argument("--data-dir", help="where the run's data set's files are now (default: as the run recorded)")
    # --nproc, --strategy and every strategy option that lays out the model (--stages, ...), and
    # --device: as `train` has them; none of the ones only training reads (gradient compression, ...).
    add_train_arguments(parser.add_argument_group("processes and strategy (as for train; default: one process)"),
                        exclude=training_only_keys(TrainConfig), only=("distributed.", "device"))


def run_predict(args: argparse.Namespace, argv: list[str]) -> int:
    from scaletrain.cli.train import given_overrides
    from scaletrain.distributed.launch import inside_worker, launch
    from scaletrain.errors import UserError
    from scaletrain.inference.predict import check_samples, input_shape, predict_run, prediction_config, read_samples
    from scaletrain.lifecycle.paths import check_writable_file
    from scaletrain.tracking.store import RunStore
    from scaletrain.training.preflight import preflight
    out = Path(args.out)
    if out.suffix != ".npy":
        raise UserError(f"--out {out}: name a .npy file (the predictions are written with numpy.save)")
    if out.exists():
        raise UserError(f"--out {out} already exists; pass a new file (predictions are never overwritten)")
    check_writable_file(out, "--out")
    samples = read_samples(args.input) if args.input else None
    with RunStore(args.store, create=False) as store:
        record = store.get(args.run_id)
    cfg = prediction_config(record, given_overrides(args), args.data_dir)
    if samples is not None:
        check_samples(samples, input_shape(cfg), record.id)
    if cfg.distributed.nproc > 1 and not inside_worker():
        preflight(cfg, cfg.distributed.nproc)      # the layout and the weights, before any worker starts
        return launch(cfg.distributed.nproc, 0, cfg.device, list(argv), command="predict",
                      devices=cfg.distributed.devices)
    result = predict_run(cfg, record.id, samples=samples, split=args.split, batch_size=args.forward_batch)
    if result.chief:
        import numpy as np
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}.npy")
        np.save(tmp, result.values.numpy())
        os.replace(tmp, out)
        print(f"predicted {len(result.values)} samples of run {record.id} in {result.processes} process(es), "
              f"split over {result.replicas} replica(s) ({result.strategy}); predictions "
              f"{tuple(result.values.shape)} in {out}")
    return 0
