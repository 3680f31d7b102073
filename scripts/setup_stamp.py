"""What scripts/setup.sh installed into ./.venv, so that a second set-up installs nothing.

`setup_stamp.py check EXTRAS`: exits 0 when this repository's scaletrain is installed (editable,
from here) with every requirement of EXTRAS, from today's pyproject.toml; `write EXTRAS` records
that after an install (adding to what earlier installs of the same pyproject.toml recorded).
Run by the venv's Python from the repository's root."""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:          # Python 3.10: scaletrain's own requirements bring tomli
    import tomli as tomllib
try:
    from packaging.requirements import Requirement
except ImportError:          # the copy inside pip, which every venv has
    from pip._vendor.packaging.requirements import Requirement

STAMP = Path(".venv/.scaletrain-setup")


def _wanted(extras: str) -> tuple[str, set[str]]:
    text = Path("pyproject.toml").read_bytes()
    project = tomllib.loads(text.decode())["project"]
    wanted = set(project["dependencies"])
    for extra in extras.split(","):
        wanted |= set(project["optional-dependencies"][extra])
    return hashlib.sha256(text).hexdigest(), wanted


def check(extras: str) -> bool:
    digest, wanted = _wanted(extras)
    done = json.loads(STAMP.read_text())
    if done["pyproject"] != digest or not wanted <= set(done["requirements"]):
        return False
    for text in wanted:                 # still there and in range: nobody changed one since
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate():
            if not requirement.specifier.contains(metadata.version(requirement.name), prereleases=True):
                return False
    origin = json.loads(metadata.distribution("scaletrain").read_text("direct_url.json") or "{}")
    return origin.get("url") == Path.cwd().as_uri() and origin.get("dir_info", {}).get("editable", False)


def write(extras: str) -> None:
    digest, done = _wanted(extras)
    try:
        before = json.loads(STAMP.read_text())
        if before["pyproject"] == digest:
            done |= set(before["requirements"])
    except (OSError, ValueError, KeyError):
        pass
    STAMP.write_text(json.dumps({"pyproject": digest, "requirements": sorted(done)}))


if __name__ == "__main__":
    command, extras = sys.argv[1:3]
    if command == "write":
        write(extras)
    else:
        try:
            sys.exit(0 if check(extras) else 1)
        except (OSError, ValueError, KeyError, metadata.PackageNotFoundError):
            sys.exit(1)
