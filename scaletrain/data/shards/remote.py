"""Shards at a URL: `--data-dir https://host/shards/` (seed 000's TPU runtime reading from a bucket;
seed 002's data too big for one host), or any fsspec scheme whose package is installed (s3://,
gs://, ... ; fsspec comes with torch).

A shard is read as a stream, never whole into memory: http(s) through the standard library (no
extra package; a server need not honour Range requests), other schemes through fsspec. A
dropped connection is retried from the byte it stopped at (a Range request; from a server that
ignores Range the bytes before it are read and dropped) until `fetch_timeout_s` passes without a
byte, then the run stops with one line naming the URL. The size a server announces must be the
manifest's, and the SHA-256 is checked as the shard streams (reader.py), so wrong bytes are
refused and named, never trained on.

Verified shards are kept in a bounded local cache, content-addressed by their SHA-256
(`<cache>/shards/<sha256>.tar`, the cache folder of data/cache.py): a later epoch or run reads
them from disk; the least recently read are dropped beyond `shard_cache_mb`. A shard enters the
cache only once its whole stream matched its checksum (written to a temporary file, then renamed).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from scaletrain.errors import DataError

URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
CONNECT_TIMEOUT_S = 10.0        # one try's wait for a connection or a byte
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
CHUNK = 1 << 20
# What a lost connection raises; anything else (404, a bad scheme) is the user's to fix.
# (connection errors, timeouts and urllib's URLError are OSErrors; a cut-off body is an HTTPException.)
TRANSIENT = (OSError, http.client.HTTPException)


def is_url(location: object) -> bool:
    return isinstance(location, str) and URL.match(location) is not None


def join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def parent(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[0]


def name_of(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[1]


@dataclass(frozen=True, slots=True)
class Fetch:
    """How shards at a URL are fetched (DataConfig's fetch_timeout_s and shard_cache_mb)."""
    timeout_s: float = 120.0
    cache_mb: float = 2048.0


class _Gone(Exception):
    """Not transient: the server answered, and the answer is no (404, 403, ...)."""


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower()


def _open_at(url: str, offset: int) -> tuple[BinaryIO, int | None]:
    """A stream of `url` from byte `offset`, and the whole resource's size where announced."""
    if _scheme(url) in ("http", "https"):
        request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
        try:
            response = urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            if exc.code >= 500 or exc.code in (408, 429):
                raise ConnectionError(f"HTTP {exc.code}") from None
            if 300 <= exc.code < 400:    # urllib's own text for this spans three lines
                raise _Gone(f"HTTP {exc.code}: the server redirects in a loop (or more times than urllib follows)") \
                    from None
            raise _Gone(f"HTTP {exc.code} {' '.join(str(exc.reason).split())}") from None
        size = None
        if response.status == 206:
            total = (response.headers.get("Content-Range") or "").rsplit("/", 1)[-1]
            size = int(total) if total.isdigit() else None
        else:
            length = response.headers.get("Content-Length")
            size = int(length) if length and length.isdigit() else None
            left = offset
            while left:   # a server without Range support: drop what was already read
                dropped = response.read(min(left, CHUNK))
                if not dropped:
                    raise ConnectionError("the connection ended early")
                left -= len(dropped)
        return response, size
    fs, path = _filesystem(url)
    try:
        size = fs.size(path)
        stream = fs.open(path, "rb")
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:   # an answer, not a lost connection
        raise _Gone(f"{type(exc).__name__}: {exc}") from None
    stream.seek(offset)
    return stream, size


def _filesystem(url: str):
    try:
        import fsspec
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:   # fsspec itself, or the scheme's package (s3fs, gcsfs, ...)
        package = exc.name or _scheme_package(_scheme(url)) or "fsspec"
        raise DataError(f"{url}: reading {_scheme(url)}:// needs the package {package} "
                        f"(pip install {package}); http(s) needs none") from None
    except ValueError as exc:
        raise DataError(f"{url}: {exc}; use http(s):// or a scheme fsspec knows (s3://, gs://, ...)") from None


def _scheme_package(scheme: str) -> str | None:
    """The package fsspec implements `scheme` in (s3 -> s3fs), from its own table: its ImportError
    for a missing one names no module, only a sentence."""
    try:
        from fsspec.registry import known_implementations
    except ImportError:
        return None
    return known_implementations.get(scheme, {}).get("class", "").partition(".")[0] or None


def _say_once(url: str, exc: BaseException, said: set) -> None:
    host = url.split("://", 1)[-1].split("/", 1)[0]
    if host not in said:
        said.add(host)
        print(f"scaletrain: note: lost the connection to {host} ({type(exc).__name__}: {exc}); retrying",
              file=sys.stderr, flush=True)


_SAID: set = set()


class RemoteFile:
    """A shard at `url` read as one stream of `size` bytes, reconnecting where it broke off;
    with a cache, the bytes are also written to a temporary file that becomes the cache entry
    when the stream ends matching `sha256`."""

    def __init__(self, url: str, size: int, sha256: str, fetch: Fetch, cache: ShardCache | None):
        self.url, self.size, self.sha256, self.fetch = url, size, sha256, fetch
        self.offset, self.stream = 0, None
        self.cache, self.spool, self.digest = cache, None, None
        if cache is not None:
            self.spool, self.digest = cache.spool(sha256), hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.offset if n < 0 else min(n, self.size - self.offset)
        out, failing_since, tries = bytearray(), None, 0
        while len(out) < n:
            try:
                if self.stream is None:
                    self.stream, announced = _open_at(self.url, self.offset)
                    if announced is not None and announced != self.size:
                        raise DataError(f"shard {self.url} is served with {announced} bytes where the manifest "
                                        f"records {self.size}; serve the shards `scaletrain shard` wrote")
                chunk = self.stream.read(min(n - len(out), CHUNK))
                if not chunk:
                    raise ConnectionError("the connection ended early")
            except _Gone as exc:
                raise DataError(f"shard {self.url} cannot be read ({exc}); check the --data-dir URL and that the "
                                "server holds every shard its manifest lists") from None
            except TRANSIENT as exc:
                self._drop_stream()
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > self.fetch.timeout_s:
                    raise DataError(f"shard {self.url}: the connection was lost ({type(exc).__name__}: {exc}) and "
                                    f"not back within {self.fetch.timeout_s:g} s; check the server (or raise "
                                    "--fetch-timeout-s)") from None
                _say_once(self.url, exc, _SAID)
                time.sleep(BACKOFF_S[min(tries, len(BACKOFF_S) - 1)])
                tries += 1
                continue
            out += chunk
            self.offset += len(chunk)
            failing_since, tries = None, 0
        if self.spool is not None:
            self.spool.write(out)
            self.digest.update(out)
        return bytes(out)

    def _drop_stream(self) -> None:
        if self.stream is not None:
            try:
                self.stream.close()
            except OSError:
                pass
            self.stream = None

    def close(self) -> None:
        self._drop_stream()
        if self.spool is not None:
            complete = self.offset == self.size and self.digest.hexdigest() == self.sha256
            self.cache.finish(self.spool, self.sha256, keep=complete)
            self.spool = None

    def __enter__(self) -> RemoteFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ShardCache:
    """Verified shards on local disk, by SHA-256, at most `limit` bytes (the least recently read go first)."""

    def __init__(self, folder: Path, limit: int):
        self.folder, self.limit = folder, limit

    @classmethod
    def for_fetch(cls, fetch: Fetch) -> ShardCache | None:
        from scaletrain.data.cache import cache_dir
        root = cache_dir()
        if root is None or fetch.cache_mb <= 0:
            return None
        folder = root / "shards"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None      # a cache that cannot be written costs only the cache
        return cls(folder, int(fetch.cache_mb * 2**20))

    def entry(self, sha256: str) -> Path | None:
        path = self.folder / f"{sha256}.tar"
        try:
            os.utime(path)    # read now: the last to be dropped
        except OSError:
            return None
        return path

    def spool(self, sha256: str):
        try:
            return open(self.folder / f".{sha256}.{os.getpid()}.{id(self)}.part", "wb")
        except OSError:
            return None

    def finish(self, spool, sha256: str, keep: bool) -> None:
        spool.close()
        try:
            if keep:
                os.replace(spool.name, self.folder / f"{sha256}.tar")
                self._bound()
            else:
                os.unlink(spool.name)
        except OSError:
            pass

    def forget(self, path: Path) -> None:
        """Drops an entry whose bytes no longer match (damaged on this disk): it is fetched again."""
        try:
            path.unlink()
        except OSError:
            pass

    def _bound(self) -> None:
        entries = []
        for path in self.folder.glob("*.tar"):
            try:
                stat = path.stat()
            except OSError:
                continue
            entries.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.limit:
                break
            self.forget(path)
            total -= size


def read_text(url: str, fetch: Fetch, what: str) -> str:
    """A small file at `url` (a manifest), with the same retries as a shard."""
    try:
        stream, _ = _open_at(url, 0)
    except _Gone as exc:
        raise DataError(f"{url}: {exc}; {what}") from None
    except TRANSIENT as exc:
        deadline = time.monotonic() + fetch.timeout_s
        while True:
            _say_once(url, exc, _SAID)
            time.sleep(1.0)
            try:
                stream, _ = _open_at(url, 0)
                break
            except _Gone as gone:
                raise DataError(f"{url}: {gone}; {what}") from None
            except TRANSIENT as again:
                if time.monotonic() > deadline:
                    raise DataError(f"{url} cannot be reached ({type(again).__name__}: {again}) within "
                                    f"{fetch.timeout_s:g} s; check the URL and the server (or raise "
                                    "--fetch-timeout-s)") from None
                exc = again
    with stream:
        body = stream.read()
    try:
        return body.decode()
    except UnicodeDecodeError:
        raise DataError(f"{url} is not text; {what}") from None


def open_remote(url: str, size: int, sha256: str, fetch: Fetch):
    """The shard at `url`: its cache entry where one is kept, else a stream (spooled into the cache)."""
    cache = ShardCache.for_fetch(fetch)
    if cache is not None:
        entry = cache.entry(sha256)
        if entry is not None and _intact(entry, size, sha256):
            return open(entry, "rb", buffering=CHUNK), entry
        if entry is not None:    # damaged on this disk since it was verified: fetched anew, never read
            entry.unlink(missing_ok=True)
    return RemoteFile(url, size, sha256, fetch, cache), None


def _intact(entry: Path, size: int, sha256: str) -> bool:
    """Whether a cached shard still has the size and SHA-256 it was verified with (read once more
    before it is used: a local read, where a damaged copy found halfway would have cost the run)."""
    try:
        if entry.stat().st_size != size:
            return False
        digest = hashlib.sha256()
        with open(entry, "rb") as fh:
            for block in iter(lambda: fh.read(CHUNK), b""):
                digest.update(block)
        return digest.hexdigest() == sha256
    except OSError:
        return False


def destination(url: str):
    """Where `scaletrain shard --out URL` puts each finished file (an fsspec scheme; the manifest
    last): a function that uploads a local file there and removes it, so the local disk holds one
    shard at a time. Refused, before any data is read: http(s) (a server is read from, not written
    to) and a location that already holds files."""
    if _scheme(url) in ("http", "https"):
        raise DataError(f"--out {url}: shards are read from an http(s) server, not written to one; write them to "
                        "a folder (then serve it) or to an fsspec URL such as s3://bucket/shards")
    fs, root = _filesystem(url)
    root = root.rstrip("/")
    try:
        if fs.exists(root) and fs.ls(root):
            raise DataError(f"--out {url} already holds files; pass a new location (shards are never written over "
                            "or merged into another set)")
        fs.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise DataError(f"--out {url} cannot be written ({type(exc).__name__}: {exc}); check the URL and its "
                        "credentials") from None

    def publish(path: Path) -> None:
        fs.put_file(str(path), f"{root}/{path.name}")
        path.unlink()
    return publish
