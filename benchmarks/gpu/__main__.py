"""Every GPU figure from one command: `python -m benchmarks.gpu --out DIR` (README.md beside this).

Runs the parts in order, each in its own process under its own time limit, so that a part that
fails, crashes or hangs costs that part alone; each writes DIR/<part>.json as it goes (with the
tail of its output), and DIR/summary.md is rewritten after every part: 8 files at most. `--rehearse` runs every part at toy size on
whatever device is here (a CPU in CI) through the same code.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu.kit import EXTRA_PARTS, PARTS, Part, error_line, read_results, result_path, write_summary

ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(__file__).resolve().parent / "wheels"
SITE = Path("/tmp/scaletrain-gpu-kit-site")
# Per part, on a CPU: a guard against a hang, not a target (the longest part, smoke, takes 57 s on
# the idle 2-core EPYC without AVX-512; beside the suite's other worker peers took over 180 s).
REHEARSAL_LIMIT_S = 400.0
OUTPUT_TAIL_CHARS = 6000   # of each part's output, kept in its result file
# The command that runs `python ARGS` for a part's process, in place of this interpreter: the
# suite's rehearsal points it at a client of an interpreter that imported torch once
# (tests/warm_client.py --python), sparing each part a cold start.
PART_PYTHON_ENV = "SCALETRAIN_KIT_PYTHON"


def install_wheels() -> str | None:
    """Installs the carried wheels (wheels.sh) into a private folder, never over the image's own
    packages (--no-deps: torch and the rest stay as the image has them). Returns that folder."""
    wheels = sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []
    if not wheels:
        return None
    if not SITE.is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--target", str(SITE), *map(str, wheels)], check=True)
    return str(SITE)


def part_limit(name: str, rehearse: bool, overrides: dict[str, float]) -> float:
    if name in overrides:
        return overrides[name]
    return REHEARSAL_LIMIT_S if rehearse else importlib.import_module(f"benchmarks.gpu.{name}").LIMIT_S


def run_one(name: str, out: Path, rehearse: bool, limit_s: float, fail: bool, hang: bool) -> None:
    """Body of a part's own process."""
    module = importlib.import_module(f"benchmarks.gpu.{name}")
    part = Part(name=name, out=out, rehearse=rehearse, limit_s=limit_s, hang_after_plan=hang)
    part.save()
    try:
        if fail:
            raise RuntimeError(f"failure injected into part {name} (--fail {name})")
        module.run(part)
        part.status = "passed"
    except Exception as exc:  # noqa: BLE001 - recorded; the runner goes on with the next part
        part.status, part.error = "failed", error_line(exc)
        raise
    finally:
        part.save()


def part_python() -> list[str]:
    """What a part's process runs as `python`: SCALETRAIN_KIT_PYTHON (split as a shell would), else
    this interpreter."""
    return shlex.split(os.environ.get(PART_PYTHON_ENV, "")) or [sys.executable]


def launch(name: str, args, limit_s: float, env: dict) -> None:
    argv = [*part_python(), "-m", "benchmarks.gpu", "--part-process", name, "--out", str(args.out),
            "--limit", f"{name}={limit_s}"] + (["--rehearse"] if args.rehearse else []) + \
        (["--fail", name] if name in args.fail else []) + (["--hang", name] if name in args.hang else [])
    start = time.monotonic()
    print(f"{name}: up to {limit_s:.0f} s", flush=True)
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=limit_s)
            ended = None if rc == 0 else f"exited with status {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # the part and what it started (a CLI run, pytest)
            proc.wait()
            ended = f"stopped at its {limit_s:.0f} s limit"
        output.seek(0)
        tail = output.read()[-OUTPUT_TAIL_CHARS:]
    took = time.monotonic() - start
    record = read_results(args.out).get(name)
    if record is None or record.get("status") == "unreadable":
        record = {"part": name, "status": "running", "rows": [], "notes": {}}
    if record.get("status") == "running" or (ended and record["status"] == "passed"):
        # The process ended before recording its end: the runner records it, keeping its rows.
        record.update(status="timed out" if ended and "limit" in ended else "failed",
                      error=record.get("error") or ended or "ended without a result")
    record.update(seconds=round(took, 2), limit_s=limit_s, output_tail=tail)
    result_path(args.out, name).write_text(json.dumps(record, indent=1, default=str))
    print(f"{name}: {record['status']} in {took:.1f} s" + (f" - {record['error']}" if record.get("error") else ""),
          flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for the result files (created; at most 8 files)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list, in any order (default: {','.join(PARTS)}; "
                   f"named only: {','.join(EXTRA_PARTS)})")
    p.add_argument("--rehearse", action="store_true", help="toy sizes, whatever the device (CI's CPU rehearsal)")
    p.add_argument("--limit", action="append", default=[], metavar="PART=SECONDS", help="override a part's limit")
    p.add_argument("--fail", action="append", default=[], metavar="PART", help="make a part raise (tests the runner)")
    p.add_argument("--hang", action="append", default=[], metavar="PART",
                   help="make a part hang once it has listed its cases (tests the runner's limit)")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="end the whole run by then: a part's limit is cut to what is left (a lease's time limit)")
    p.add_argument("--part-process", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        overrides = {k: float(v) for k, v in (item.split("=", 1) for item in args.limit)}
    except ValueError:
        p.error("--limit takes PART=SECONDS, e.g. --limit smoke=90")
    parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    unknown = [s for s in parts + list(overrides) + args.fail + args.hang if s not in PARTS + EXTRA_PARTS]
    if unknown:
        p.error(f"unknown part {unknown[0]!r}; the parts are {', '.join(PARTS + EXTRA_PARTS)}")
    if args.part_process:
        run_one(args.part_process, args.out, args.rehearse, overrides[args.part_process],
                args.part_process in args.fail, args.part_process in args.hang)
        return 0
    from scaletrain.errors import UserError
    from scaletrain.lifecycle.paths import check_writable_dir
    try:   # checked before any part starts, with the library's own path check
        check_writable_dir(args.out, "--out")
    except UserError as exc:
        p.error(str(exc))
    args.out.mkdir(parents=True, exist_ok=True)
    for name in parts:   # a rerun of some parts replaces only their files
        result_path(args.out, name).unlink(missing_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    site = None if args.rehearse else install_wheels()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), site, env.get("PYTHONPATH")]))
    command = "python -m benchmarks.gpu " + shlex.join(argv if argv is not None else sys.argv[1:])
    start = time.monotonic()
    for name in parts:
        limit = part_limit(name, args.rehearse, overrides)
        if args.deadline is not None:
            limit = min(limit, args.deadline - (time.monotonic() - start))
            if limit < 5:
                print(f"{name}: not run, the --deadline is reached", flush=True)
                continue
        try:
            launch(name, args, limit, env)
        except Exception as exc:  # noqa: BLE001 - the runner itself must reach the next part
            print(f"{name}: the runner failed: {error_line(exc)}", flush=True)
        write_summary(args.out, command)
    print(f"all parts in {time.monotonic() - start:.1f} s; summary: {args.out / 'summary.md'}", flush=True)
    print((args.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
