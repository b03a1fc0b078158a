"""Worker discovery through etcd: registration, heartbeats and the fleet view.

A worker registers itself with `Registrar` (a lease, a key
`registryPrefix + workerAddr`, a JSON `WorkerHeartbeat` republished every
heartbeat interval, deregistration on drain). Coordinators read the fleet
into a `WorkerDirectory` through `EtcdClient` and place tasks with
`blockx.client.PlacementClient`. asyncio is allowed here (the etcd client is
grpclib on trio-asyncio's loop) and must not leak out: every public call is
Trio-facing and every failure is an `EtcdError`.
"""

from blockx.discovery._directory import (
    KeyEvent,
    KeyEventKind,
    Rejected,
    WorkerDirectory,
)
from blockx.discovery._etcd import (
    BidiStream,
    EtcdCallError,
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    InvalidEtcdEndpoint,
    KeepAlive,
    Lease,
    LeaseNotFound,
    RangeSnapshot,
    WatchCanceled,
    parse_endpoint,
    prefix_range_end,
)
from blockx.discovery._heartbeat import (
    JSON_KEYS,
    MalformedHeartbeat,
    WorkerHeartbeat,
    healthy_executors,
    heartbeat_of,
)
from blockx.discovery._registration import DEREGISTER_TIMEOUT_S, Registrar

__all__ = [
    "DEREGISTER_TIMEOUT_S",
    "JSON_KEYS",
    "BidiStream",
    "EtcdCallError",
    "EtcdClient",
    "EtcdError",
    "EtcdUnavailable",
    "InvalidEtcdEndpoint",
    "KeepAlive",
    "KeyEvent",
    "KeyEventKind",
    "Lease",
    "LeaseNotFound",
    "MalformedHeartbeat",
    "RangeSnapshot",
    "Registrar",
    "Rejected",
    "WatchCanceled",
    "WorkerDirectory",
    "WorkerHeartbeat",
    "healthy_executors",
    "heartbeat_of",
    "parse_endpoint",
    "prefix_range_end",
]
