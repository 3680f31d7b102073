"""`scaletrain shard`: writes any data set scaletrain loads into WebDataset shards with a manifest,
for `--data shards` (data/shards)."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from rich.table import Table

from scaletrain.cli.flags import add_number
from scaletrain.console import make_console
from scaletrain.errors import ConfigError
from scaletrain.lifecycle.paths import check_new_output_dir


def add_shard_arguments(parser: argparse.ArgumentParser) -> None:
    from scaletrain.cli.train import add_train_arguments
    add_train_arguments(parser)
    g = parser.add_argument_group("shards")
    g.add_argument("--out", required=True, metavar="DIR", help="a new folder for the shards and their manifest, or a "
                   "URL of a scheme fsspec writes (s3://, gs://, ...: each shard uploaded as it is finished)")
    add_number(g, "--samples-per-shard", int, ge=1, default=1000, metavar="N",
                   help="most samples in one shard (a split's shards are balanced to within one sample)")


def run_shard(args: argparse.Namespace, argv: list[str]) -> int:
    from scaletrain.cli.train import config_from_args
    from scaletrain.data import load_dataset
    from scaletrain.data.shard_set import shards_package
    cfg = config_from_args(args)
    if cfg.data.name == "shards":
        raise ConfigError("--data shards is already sharded; name the data set to convert (e.g. --data mnist1d)")
    write_shards = shards_package().write_shards   # checks the optional package before loading any data
    from scaletrain.data.shards.remote import destination, is_url
    if is_url(args.out):
        out, publish = args.out, destination(args.out)
        folder = Path(tempfile.mkdtemp(prefix="scaletrain-shards-"))   # one shard at a time on its way up
    else:
        out, publish = check_new_output_dir(args.out, "--out", "files"), None
        folder = Path(out)
    dataset = load_dataset(cfg.data, seed=cfg.seed)
    try:
        manifest = write_shards(dataset, folder, args.samples_per_shard, publish)
    finally:
        if publish is not None:
            shutil.rmtree(folder, ignore_errors=True)
    table = Table(title=f"{dataset.name} -> {out}")
    for column in ("split", "shards", "samples", "MB"):
        table.add_column(column, justify="right" if column != "split" else "left")
    for split in ("train", "val", "test"):
        shards = manifest.split(split)
        table.add_row(split, str(len(shards)), str(sum(s.samples for s in shards)),
                      f"{sum(s.bytes for s in shards) / 1e6:.2f}")
    make_console().print(table)
    return 0
