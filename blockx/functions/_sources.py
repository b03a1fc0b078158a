"""Where function code comes from: a directory, Redis, or memory (tests).

Owns reading snapshots and naming their epochs, and publishing a directory to
Redis. Every call here blocks (file or network IO): the worker calls them
from a thread (`trio.to_thread.run_sync`), never on the Trio thread itself.
Must never import trio. IO failures are translated into `SourceUnavailable`
(with `raise ... from`), so callers handle one error family.

Redis layout under a prefix (default `blockx:functions:`):
`{prefix}snapshot:{epoch}` is a hash module -> source text, and
`{prefix}current` holds the current epoch. A publisher writes the snapshot
before it moves `current`, in one MULTI/EXEC, so a reader never sees a
current epoch without its snapshot.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from blockx.functions._errors import (
    EmptySnapshot,
    InvalidModuleName,
    NothingPublished,
    SourceUnavailable,
    UnknownEpoch,
)
from blockx.functions._snapshot import FunctionSnapshot, is_valid_module_name

if TYPE_CHECKING:
    import redis
    from redis.typing import EncodableT, FieldT

DEFAULT_REDIS_PREFIX = "blockx:functions:"
DEFAULT_REDIS_TIMEOUT_S = 5.0


class FunctionSource(Protocol):
    """A place snapshots are read from. Both calls block."""

    def current_epoch(self) -> str:
        """The epoch the source calls current now."""
        ...

    def load(self, epoch: str) -> FunctionSnapshot:
        """The snapshot of `epoch`; `UnknownEpoch` if the source does not have it."""
        ...


class MemorySource:
    """An in-memory source for tests: `publish` makes a new current epoch.

    Setting `unavailable` makes every read fail with `SourceUnavailable`, the
    way a Redis outage would.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: dict[str, FunctionSnapshot] = {}
        self._current: str | None = None
        self.unavailable = False

    def __repr__(self) -> str:
        return "MemorySource()"

    def publish(self, modules: Mapping[str, str]) -> str:
        snapshot = FunctionSnapshot.of(modules)
        with self._lock:
            self._snapshots[snapshot.epoch] = snapshot
            self._current = snapshot.epoch
        return snapshot.epoch

    def current_epoch(self) -> str:
        with self._lock:
            self._check_available()
            if self._current is None:
                raise NothingPublished(source="memory")
            return self._current

    def load(self, epoch: str) -> FunctionSnapshot:
        with self._lock:
            self._check_available()
            snapshot = self._snapshots.get(epoch)
        if snapshot is None:
            raise UnknownEpoch(epoch=epoch)
        return snapshot

    def _check_available(self) -> None:
        if self.unavailable:
            raise SourceUnavailable(source="memory", reason="marked unavailable")


def read_directory(path: Path) -> dict[str, str]:
    """Every `*.py` under `path` as dotted module name -> source text.

    `pkg/mod.py` is `pkg.mod`, `pkg/__init__.py` is `pkg`. Hidden files and
    directories (editor locks, `.git`) and `__pycache__` are skipped; any other
    file whose name cannot be imported is an error, not silently left out.
    """
    if not path.is_dir():
        raise SourceUnavailable(source=str(path), reason="not a directory")
    modules: dict[str, str] = {}
    try:
        for dirpath, dirnames, filenames in os.walk(path, onerror=_raise, followlinks=False):
            dirnames[:] = sorted(
                d for d in dirnames if not d.startswith(".") and d != "__pycache__"
            )
            for filename in sorted(filenames):
                if filename.startswith(".") or not filename.endswith(".py"):
                    continue
                file = Path(dirpath, filename)
                module = _module_name(file.relative_to(path))
                modules[module] = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise SourceUnavailable(source=str(path), reason=str(error)) from error
    return modules


def _raise(error: OSError) -> None:
    raise error


def _module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    module = ".".join(parts)
    if not parts or not is_valid_module_name(module):
        raise InvalidModuleName(module=module or "__init__", origin=f"file {relative}")
    return module


class DirectorySource:
    """A directory of `.py` files; the epoch is the content hash.

    Reading unchanged files gives the same epoch. Every snapshot this source
    has produced stays loadable for the life of the object, so an epoch stays
    readable after the files change.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._snapshots: dict[str, FunctionSnapshot] = {}

    def __repr__(self) -> str:
        return f"DirectorySource({str(self.path)!r})"

    def read(self) -> FunctionSnapshot:
        """Read the directory now; remember and return its snapshot."""
        snapshot = FunctionSnapshot.of(read_directory(self.path))
        with self._lock:
            return self._snapshots.setdefault(snapshot.epoch, snapshot)

    def current_epoch(self) -> str:
        return self.read().epoch

    def load(self, epoch: str) -> FunctionSnapshot:
        with self._lock:
            snapshot = self._snapshots.get(epoch)
        if snapshot is not None:
            return snapshot
        snapshot = self.read()
        if snapshot.epoch != epoch:
            raise UnknownEpoch(epoch=epoch)
        return snapshot


def redact_url(url: str) -> str:
    """`url` with any password replaced by `***`, for messages and logs."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "<unparsable URL>"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))


def _redis_client(url: str, timeout_s: float) -> redis.Redis:
    import redis  # noqa: PLC0415 -- executor processes import this package without needing redis

    try:
        return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    except ValueError as error:
        raise SourceUnavailable(
            source=f"Redis at {redact_url(url)}", reason=f"invalid URL: {error}"
        ) from error


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisSource:
    """Snapshots published to Redis (see the module docstring for the keys)."""

    def __init__(
        self,
        url: str,
        prefix: str = DEFAULT_REDIS_PREFIX,
        *,
        timeout_s: float = DEFAULT_REDIS_TIMEOUT_S,
    ) -> None:
        self.prefix = prefix
        self.display = f"Redis at {redact_url(url)}"
        self._client = _redis_client(url, timeout_s)

    def __repr__(self) -> str:
        return f"RedisSource({self.display!r}, prefix={self.prefix!r})"

    def close(self) -> None:
        self._client.close()

    def current_epoch(self) -> str:
        import redis  # noqa: PLC0415 -- see _redis_client

        try:
            value = self._client.get(current_key(self.prefix))
        except (redis.RedisError, OSError) as error:
            raise SourceUnavailable(source=self.display, reason=str(error)) from error
        if value is None:
            raise NothingPublished(source=f"{self.display} (key {current_key(self.prefix)!r})")
        return _text(value)

    def load(self, epoch: str) -> FunctionSnapshot:
        import redis  # noqa: PLC0415 -- see _redis_client

        try:
            fields = self._client.hgetall(snapshot_key(self.prefix, epoch))
        except (redis.RedisError, OSError) as error:
            raise SourceUnavailable(source=self.display, reason=str(error)) from error
        if not fields:
            raise UnknownEpoch(epoch=epoch)
        try:
            modules = {_text(name): _text(text) for name, text in fields.items()}
        except UnicodeDecodeError as error:
            raise SourceUnavailable(
                source=self.display, reason=f"epoch {epoch!r} holds text that is not UTF-8"
            ) from error
        return FunctionSnapshot(epoch=epoch, modules=modules)


def current_key(prefix: str) -> str:
    return f"{prefix}current"


def snapshot_key(prefix: str, epoch: str) -> str:
    return f"{prefix}snapshot:{epoch}"


def publish_directory(
    path: Path | str,
    url: str,
    prefix: str = DEFAULT_REDIS_PREFIX,
    *,
    timeout_s: float = DEFAULT_REDIS_TIMEOUT_S,
) -> str:
    """Publish the `.py` files under `path` to Redis as the current epoch; return it.

    Idempotent: unchanged content is the same epoch and leaves Redis as it was.
    Superseded snapshots stay in Redis (workers may still pin them).
    """
    import redis  # noqa: PLC0415 -- see _redis_client

    snapshot = FunctionSnapshot.of(read_directory(Path(path)))
    if not snapshot.modules:
        # An empty hash does not exist in Redis: it could never be loaded back.
        raise EmptySnapshot(source=str(path))
    display = f"Redis at {redact_url(url)}"
    client = _redis_client(url, timeout_s)
    try:
        with client.pipeline(transaction=True) as pipe:
            key = snapshot_key(prefix, snapshot.epoch)
            pipe.delete(key)
            mapping: dict[FieldT, EncodableT] = dict(snapshot.modules.items())
            pipe.hset(key, mapping=mapping)
            pipe.set(current_key(prefix), snapshot.epoch)
            pipe.execute()
    except (redis.RedisError, OSError) as error:
        raise SourceUnavailable(source=display, reason=str(error)) from error
    finally:
        client.close()
    return snapshot.epoch
