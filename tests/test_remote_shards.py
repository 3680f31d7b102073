"""Shards streamed from a URL (data/shards/remote.py), against real HTTP servers on loopback: Python's
own `http.server` (what a user serving a folder would run) and the same server rate-limited, killed
mid-epoch and restarted (tests/plugins/shard_server.py); fsspec's file:// for the other schemes."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from scaletrain.config import DataConfig
from scaletrain.data import load_dataset
from scaletrain.data.shards import Manifest, load_shards, write_shards
from scaletrain.data.shards.reader import read_split
from scaletrain.data.shards.remote import Fetch, ShardCache
from scaletrain.errors import DataError
from tests.processes import DIGITS_MLP, PLUGINS, free_port, kill_slowed_run_after_checkpoint, metrics, run, wait_for

pytestmark = pytest.mark.timeout(300)

TRAIN = ["train", *DIGITS_MLP, "--data", "shards", "--num-workers", "2", "--epochs", "2", "--batch-size", "64"]
KEYS = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "optimizer_steps")


@pytest.fixture(scope="module")
def shard_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("remote") / "s"
    write_shards(load_dataset(DataConfig(name="digits")), folder, samples_per_shard=160)
    return folder


class Server:
    """A real HTTP server process serving `folder` on a loopback port; `kill` and `start` again."""

    def __init__(self, folder: Path, log: Path, *, rate: float = 0.0, plain: bool = False):
        self.folder, self.log, self.rate, self.plain = folder, log, rate, plain
        self.port, self.proc = free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        if self.plain:   # exactly what a user types
            cmd = [sys.executable, "-m", "http.server", str(self.port), "--bind", "127.0.0.1", "--directory",
                   str(self.folder)]
        else:
            cmd = [sys.executable, str(PLUGINS / "shard_server.py"), str(self.folder), str(self.port), str(self.log),
                   "--ranges", "--rate", str(self.rate)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, 20, "the HTTP server to listen")
        return self

    def _answers(self) -> bool:
        import socket
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def sending(self) -> list[str]:
        """The files it is part way through sending (their first bytes out, not yet their last)."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        begun = [line.split(" ", 1)[1] for line in lines if line.startswith("sending ")]
        for line in lines:
            if line.startswith("done ") and line[5:] in begun:
                begun.remove(line[5:])
        return begun

    def requests(self) -> list[tuple[str, str]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [tuple(line.split(" ", 1)) for line in lines if line.startswith("/")]


@pytest.fixture
def servers():
    started: list[Server] = []
    yield started
    for server in started:
        if server.proc and server.proc.poll() is None:
            server.kill()


@pytest.mark.usefixtures("processes")
def test_a_url_trains_as_the_folder_does_through_a_server_killed_mid_epoch(tmp_path, shard_folder, servers):
    local = run([*TRAIN, "--data-dir", str(shard_folder), "--run-dir", str(tmp_path / "local")], tmp_path,
                SCALETRAIN_CACHE_DIR="off")
    assert local.returncode == 0, local.stderr[-2000:]
    # About 330 KB a shard at 400 KB/s: each takes most of a second. The kill waits for one part way
    # out (on a busy machine the workers can have all they asked for and be waiting on the training).
    server = Server(shard_folder, tmp_path / "server.log", rate=400_000)
    servers.append(server.start())
    cache = tmp_path / "cache"
    job = subprocess.Popen([sys.executable, "-m", "scaletrain", *TRAIN, "--data-dir", server.url + "/",
                            "--run-dir", str(tmp_path / "url")], cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "SCALETRAIN_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"})
    wait_for(lambda: sum(path.startswith("/train-") for path, _ in server.requests()) >= 3
             and any(path.startswith("/train-") for path in server.sending()), 120,
             "three training shards asked for, one of them part way out")
    server.kill()            # mid-epoch, mid-shard: two workers are streaming
    with open(server.log, "a") as log:
        log.write("killed\n")
    time.sleep(2.0)
    server.start()
    out, err = job.communicate(timeout=240)
    assert job.returncode == 0, err[-3000:]
    assert "lost the connection to 127.0.0.1" in err and "Traceback" not in err
    # A stream cut off mid-shard went on from the byte it reached.
    assert any(path.startswith("/train-") and rng.startswith("bytes=") and rng != "bytes=0-"
               for path, rng in server.requests()), server.requests()
    # The same samples in the same order: the folder's numbers exactly.
    assert [[m[k] for k in KEYS] for m in metrics(tmp_path / "local")] == \
           [[m[k] for k in KEYS] for m in metrics(tmp_path / "url")]
    # Every shard verified on the way is in the cache, under its checksum; the second epoch read it there.
    manifest = Manifest.read(shard_folder)
    assert {p.name for p in (cache / "shards").glob("*.tar")} == {f"{s.sha256}.tar" for s in manifest.shards}
    # Each shard is asked from its first byte once; a stream the kill cut before its first byte arrived is
    # asked from the start again (at most one a worker, two here). Nothing is asked a third time: the
    # second epoch read the cache.
    log = server.log.read_text().split("killed\n")
    before, after = ([line.split(" ", 1)[0] for line in part.splitlines()
                      if line.startswith("/train-") and line.endswith(" -")] for part in log)
    assert len(before) == len(set(before)) and len(after) == len(set(after)), log
    assert len(set(before) & set(after)) <= 2, log
    assert len(before) + len(after) <= len(manifest.split("train")) + 2, log


@pytest.mark.usefixtures("processes")
def test_a_url_run_killed_mid_epoch_resumes_bitwise(tmp_path, shard_folder, servers):
    server = Server(shard_folder, tmp_path / "server.log")
    servers.append(server.start())

    def args(name):
        return [*TRAIN, "--data-dir", server.url, "--model-option", "dropout=0.1", "--checkpoint-every", "7",
                "--run-dir", str(tmp_path / name)]
    full = run(args("full"), tmp_path, SCALETRAIN_CACHE_DIR="off")
    assert full.returncode == 0, full.stderr
    kill_slowed_run_after_checkpoint(args("cut"), tmp_path, tmp_path / "cut", step=21, delay_s=0.05)
    resumed = run(["train", "--run-dir", str(tmp_path / "cut"), "--resume", "auto"], tmp_path, SCALETRAIN_CACHE_DIR="off")
    assert resumed.returncode == 0, resumed.stderr
    assert [[m[k] for k in KEYS] for m in metrics(tmp_path / "full")] == \
           [[m[k] for k in KEYS] for m in metrics(tmp_path / "cut")]
    a, b = (torch.load(tmp_path / n / "model.pt", weights_only=True) for n in ("full", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.usefixtures("processes")
def test_a_shard_served_wrong_is_refused_and_named(tmp_path, shard_folder, servers):
    served = tmp_path / "served"
    served.mkdir()
    for file in shard_folder.iterdir():
        (served / file.name).write_bytes(file.read_bytes())
    server = Server(served, tmp_path / "server.log", plain=True)   # `python -m http.server`, as a user runs it
    servers.append(server.start())
    cache = tmp_path / "cache"
    victim = served / "train-0003.tar"
    good = victim.read_bytes()
    damaged = bytearray(good)
    damaged[-1] ^= 0xFF       # in the archive's end padding: it reads as a shard, its checksum differs
    cases = ((bytes(damaged), "does not match its SHA-256 checksum"),
             (good[:-512], f"is served with {len(good) - 512} bytes where the manifest records {len(good)}"),
             (None, "cannot be read (HTTP 404"))
    for body, message in cases:
        if body is None:
            victim.unlink()
        else:
            victim.write_bytes(body)
        out = run([*TRAIN, "--data-dir", server.url, "--epochs", "1", "--run-dir", str(tmp_path / f"r{len(message)}")],
                  tmp_path, SCALETRAIN_CACHE_DIR=str(cache))
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
        line = out.stderr.strip().splitlines()[-1]
        assert f"{server.url}/train-0003.tar" in line and message in line, line
    # Wrong bytes never enter the cache.
    sha = Manifest.read(shard_folder).split("train")[3].sha256
    assert not (cache / "shards" / f"{sha}.tar").exists()


def test_fsspec_schemes_read_the_same_samples_and_unknown_ones_are_one_line(shard_folder):
    by_url = load_shards(f"file://{shard_folder}")
    by_folder = load_shards(str(shard_folder))
    assert torch.equal(by_url.test.x, by_folder.test.x) and torch.equal(by_url.test.y, by_folder.test.y)
    manifest = Manifest.read(f"file://{shard_folder}", Fetch(cache_mb=0))
    back = read_split(manifest, "train")
    assert len(back.y) == sum(s.samples for s in manifest.split("train"))
    with pytest.raises(DataError, match="nosuch://"):
        Manifest.read("nosuch://host/shards")
    if importlib.util.find_spec("s3fs") is None:   # a scheme whose package is missing: that package named
        with pytest.raises(DataError, match="reading s3:// needs the package s3fs \\(pip install s3fs\\)"):
            Manifest.read("s3://bucket/shards")
    with pytest.raises(DataError, match="FileNotFoundError"):   # an answer, not retried for --fetch-timeout-s
        Manifest.read(f"file://{shard_folder}-missing", Fetch(timeout_s=600))


def test_the_cache_keeps_the_most_recently_read_within_its_bound(tmp_path):
    cache = ShardCache(tmp_path, limit=2500)    # room for two entries of 1000 bytes
    a, b, c, partial = (f"{i:064x}" for i in range(4))

    def put(sha, keep=True):
        spool = cache.spool(sha)
        spool.write(b"x" * 1000)
        cache.finish(spool, sha, keep=keep)
        time.sleep(0.02)
    put(a)
    put(b)
    assert cache.entry(a) is not None    # read again: now more recent than b
    time.sleep(0.02)
    put(c)
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == sorted([f"{a}.tar", f"{c}.tar"])
    put(partial, keep=False)              # a stream that did not verify leaves nothing behind
    assert not list(tmp_path.glob(f"*{partial}*"))


@pytest.mark.usefixtures("processes")
def test_shard_writes_to_an_fsspec_url_and_refuses_a_server_or_a_used_location(tmp_path):
    out = f"file://{tmp_path / 'up'}"
    written = run(["shard", "--data", "digits", "--out", out, "--samples-per-shard", "400"], tmp_path)
    assert written.returncode == 0, written.stderr[-2000:]
    back, original = load_shards(out), load_dataset(DataConfig(name="digits"))
    assert torch.equal(back.test.x, original.test.x) and torch.equal(back.test.y, original.test.y)
    assert {p.name for p in (tmp_path / "up").iterdir()} >= {"manifest.json", "train-0000.tar", "test-0000.tar"}
    for target, message in ((out, "already holds files"), ("http://127.0.0.1:9/s", "not written to one")):
        refused = run(["shard", "--data", "digits", "--out", target], tmp_path)
        assert refused.returncode == 2 and message in refused.stderr and "Traceback" not in refused.stderr


def test_a_cached_shard_damaged_on_disk_is_fetched_again_not_fatal(tmp_path, shard_folder, monkeypatch):
    """A shard kept in the cache, then damaged on this disk: the next read notices before it reads
    a sample, drops the copy and fetches the shard anew (issue 66: the run stopped instead)."""
    monkeypatch.setenv("SCALETRAIN_CACHE_DIR", str(tmp_path / "cache"))
    manifest = Manifest.read(f"file://{shard_folder}", Fetch(cache_mb=100))
    first = read_split(manifest, "train")
    cached = sorted((tmp_path / "cache" / "shards").glob("*.tar"))
    assert cached
    data = bytearray(cached[0].read_bytes())
    data[700] ^= 0xFF
    cached[0].write_bytes(bytes(data))
    again = read_split(Manifest.read(f"file://{shard_folder}", Fetch(cache_mb=100)), "train")
    assert torch.equal(first.x, again.x) and torch.equal(first.y, again.y)
    assert cached[0].read_bytes() != bytes(data)      # the copy kept now is the verified one


def test_a_redirect_loop_at_the_manifest_url_is_one_line(tmp_path):
    """A server that redirects every request to itself: one line naming the URL (issue 66: three)."""
    import http.server
    import threading

    class Loop(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", self.path)
            self.end_headers()

        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", 0), Loop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/shards"
        with pytest.raises(DataError) as caught:
            Manifest.read(url, Fetch(timeout_s=5))
        assert "\n" not in str(caught.value) and "redirects in a loop" in str(caught.value), str(caught.value)
        assert url in str(caught.value)
    finally:
        server.shutdown()
        server.server_close()
