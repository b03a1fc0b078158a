"""Who a worker is: the one `WorkerIdentity` value every part that names the worker reads.

The gRPC status reply, the etcd heartbeat, the metrics status page and the
logs all show the same address, deployment, version and start time, because
they all get this value, made once when the worker has bound its port.
"""

from __future__ import annotations

from importlib import metadata

import attrs


def version() -> str:
    """The installed blockx version ("0+unknown" when run from a tree that is not installed)."""
    try:
        return metadata.version("blockx")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@attrs.frozen(kw_only=True)
class WorkerIdentity:
    worker_addr: str
    """host:port that coordinators call; also the suffix of the worker's etcd key."""
    deployment: str
    version: str
    started_at_ms: int
