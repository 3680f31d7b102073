"""Every `scaletrain` line of README.md and docs/ parses, and a `train` line's configuration passes
its checks: a renamed flag, a removed recipe or an out-of-range value in the docs fails here, in
a second and without torch. (`make doc-test` runs the lines themselves: doctests/.)"""

from __future__ import annotations

import re
import shlex
from itertools import pairwise

import pytest

from doctests.test_doc_commands import ALL, FILES, RUN_IDS
from scaletrain.cli.main import build_parser

LINES = [c for c in ALL if not c.skip and c.text.startswith("scaletrain ")]


def test_the_docs_have_scaletrain_lines():
    assert len(LINES) >= 50


@pytest.mark.parametrize("command", LINES, ids=[c.id for c in LINES])
def test_doc_line_parses_and_its_config_passes_its_checks(command, tmp_path, monkeypatch):
    text = re.sub(r"\s*\[[^\]]*\]", "", command.text).rstrip("&").strip()
    if "..." in text:
        assert command.fill is not None, f"{command.id}: a '...' with no `doc-test: ... =` directive"
        text = text.replace("...", command.fill)
    for placeholder in RUN_IDS:
        text = re.sub(rf"\b{placeholder}\b", "0123abcd", text)
    words = shlex.split(text)[1:]
    for name, body in FILES.items():
        (tmp_path / name).write_text(body)
    monkeypatch.chdir(tmp_path)
    for flag, path in pairwise(words):
        if flag == "--init-from":   # the saved weights an earlier doc line trains (doc-test runs that)
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).touch()
    args = build_parser(only=words[0]).parse_args(words)
    assert args.command == words[0]
    if words[0] == "train" and not any(w.startswith("scaletrain-runs/") for w in words):
        from scaletrain.cli.train import config_from_args
        config_from_args(args)     # every value checked beside its field
