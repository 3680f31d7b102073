"""`scaletrain export RUN_ID`: the run's model as a torch.export program (or ONNX) for serving."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaletrain.cli.flags import add_trust_code
from scaletrain.tracking.store import DEFAULT_STORE


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    add_trust_code(parser)
    parser.add_argument("run_id", metavar="RUN_ID", help="a run with a saved model (model.pt)")
    parser.add_argument("--format", default="pt2", choices=("pt2", "onnx"),
                        help="pt2: torch.export's program (default); onnx: needs pip install 'scaletrain[onnx]'")
    parser.add_argument("--out", help="the file to write (default: model.<format> beside the run's model.pt)")
    parser.add_argument("--store", default=str(DEFAULT_STORE), help=f"the run store (default {DEFAULT_STORE})")
    parser.add_argument("--data-dir", help="where the run's data set's files are now (default: as the run recorded)")


def run_export(args: argparse.Namespace, argv: list[str]) -> int:
    from scaletrain.inference.export import check_export_target, default_export_path, export_run
    from scaletrain.tracking.store import RunStore
    with RunStore(args.store, create=False) as store:
        record = store.get(args.run_id)
    out = Path(args.out) if args.out else default_export_path(record, args.format)
    check_export_target(out, args.format)   # before the model is built
    result = export_run(record, out, args.format, args.data_dir)
    check = ("not run (install onnxruntime to check it)" if result.max_abs_diff is None else
             f"max |difference| {result.max_abs_diff:.2g} from the trained model on {result.checked_samples} test "
             "samples")
    shape = ", ".join(map(str, result.input_shape))
    print(f"exported run {record.id} to {result.path} ({result.fmt}; input: a batch of [{shape}] samples, "
          f"raw as in the data set; output: the task's predictions); check: {check}")
    return 0
