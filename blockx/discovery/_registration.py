"""The registration actor: one worker's key in etcd, kept alive and current.

Theory of operation:

* Once the worker is ready the registrar grants a lease (`etcdLeaseTtlMs`,
  rounded up to whole seconds; etcd may raise it) and puts
  `registryPrefix + workerAddr` = the heartbeat JSON, attached to the lease.
  It renews the lease over one LeaseKeepAlive stream at a third of its TTL:
  the lease, not the heartbeat, is what says the worker is alive.
* Every `heartbeatIntervalMs` it reads the heartbeat again and puts it only
  if its JSON differs from the last put of this lease's session, or
  `heartbeatRefreshMs` has passed since that put. Every put is a new etcd
  revision, which every watcher of the fleet receives: a fleet that rewrote
  unchanged keys five times a second would cost etcd and its watchers in
  proportion to its size, not to its changes. So the interval bounds how
  stale the key may be (a change is put at the next look, and changes in
  between are coalesced into one put), and an idle worker puts once per
  refresh. Puts are always made with the lease (a put without it would
  detach the key); a new session (a new lease, or after an outage) puts at
  once whatever was put before.
* A renewal answering TTL 0, or a put answering "lease not found", means the
  lease expired: a new one is granted and the key put again at once.
* etcd unreachable: the worker keeps serving. The first failure of an outage
  is logged once at WARNING; the registrar retries in the background with
  exponential back-off and logs at INFO when it is registered again. It
  first tries to renew the lease it had (etcd keeps leases across a restart)
  and grants a new one only when that lease is gone.
* `deregister()` (the first step of a drain) stops the heartbeats, then
  revokes the lease, which deletes the key; it is bounded by a short timeout
  so that a dead etcd never delays a shutdown. A lease that cannot be
  revoked lapses on its own within its TTL.

The heartbeat itself comes from an async callable the application passes in
(it asks the worker's actors); the registrar never reads worker state of its
own.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import trio

from blockx.discovery._etcd import (
    CALL_TIMEOUT_S,
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    Lease,
    LeaseNotFound,
    parse_endpoint,
)
from blockx.discovery._heartbeat import WorkerHeartbeat

logger = logging.getLogger("blockx.discovery")

RETRY_MIN_S = 0.5
RETRY_MAX_S = 5.0
"""Back-off between registration attempts while etcd is unreachable."""
DEREGISTER_TIMEOUT_S = 2.0
"""The most a drain waits for the lease to be revoked."""
MIN_INTERVAL_S = 0.01


class _LeaseExpired(Exception):
    """The lease is gone: grant a new one and put the key again."""


class LeaseRenewer(Protocol):
    """One keep-alive stream (`blockx.discovery.KeepAlive`)."""

    async def renew(self, lease_id: int) -> int: ...


class RegistrarEtcd(Protocol):
    """The calls of `EtcdClient` a registrar makes: a stand-in needs only these."""

    async def put(self, key: str, value: bytes, *, lease_id: int = 0) -> int: ...

    async def delete(self, key: str) -> int: ...

    async def grant_lease(self, ttl_s: int) -> Lease: ...

    async def revoke_lease(self, lease_id: int) -> None: ...

    def keep_alive(self) -> AbstractAsyncContextManager[LeaseRenewer]: ...


class Registrar:
    """Keeps `key` registered in etcd with the worker's heartbeat. Start `run` in a nursery."""

    def __init__(
        self,
        *,
        endpoints: Sequence[str],
        key: str,
        lease_ttl_ms: int,
        heartbeat_interval_ms: int,
        heartbeat_refresh_ms: int,
        heartbeat: Callable[[], Awaitable[WorkerHeartbeat]],
        call_timeout_s: float = CALL_TIMEOUT_S,
        connect: Callable[[], AbstractAsyncContextManager[RegistrarEtcd]] | None = None,
    ) -> None:
        """`connect` opens the etcd client (default: `EtcdClient.connect(endpoints)`);
        tests pass a stand-in to run the registrar on a virtual clock."""
        for endpoint in endpoints:
            parse_endpoint(endpoint)  # refuse a bad endpoint at start, not at the first call
        self.key = key
        self._endpoints = tuple(endpoints)
        self._lease_ttl_s = max(1, math.ceil(lease_ttl_ms / 1000))
        self._interval_s = max(MIN_INTERVAL_S, heartbeat_interval_ms / 1000)
        self._refresh_s = max(self._interval_s, heartbeat_refresh_ms / 1000)
        self._heartbeat = heartbeat
        self._call_timeout_s = call_timeout_s
        self._connect = connect or self._connect_etcd
        self._puts = 0
        self._lease_id: int | None = None
        self._retry_s = RETRY_MIN_S
        self._in_outage = False
        self._ever_registered = False
        self._session_registered = False
        self._deregistering = False
        self._started = False
        self._registering = trio.CancelScope()
        self._done = trio.Event()

    @property
    def lease_id(self) -> int | None:
        """The lease the key is attached to; None before registering and after deregistering."""
        return self._lease_id

    @property
    def puts(self) -> int:
        """Heartbeats put in etcd so far (each one a new etcd revision)."""
        return self._puts

    async def run(
        self,
        ready: trio.Event | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Register once `ready` is set and keep the key current until `deregister()`.

        Must run inside `trio_asyncio.open_loop()`.
        """
        self._started = True
        task_status.started()
        try:
            async with self._connect() as client:
                with self._registering:
                    if ready is not None:
                        await ready.wait()
                    await self._register_forever(client)
                if self._deregistering:
                    with trio.move_on_after(DEREGISTER_TIMEOUT_S):
                        await self._release(client)
        finally:
            self._done.set()

    async def deregister(self, timeout_s: float = DEREGISTER_TIMEOUT_S) -> None:
        """Stop publishing and remove the key (revoke the lease); at most `timeout_s`."""
        self._deregistering = True
        self._registering.cancel()
        if not self._started:
            return  # never registered; a later `run` sees the flag and does nothing
        with trio.move_on_after(timeout_s):
            await self._done.wait()

    # --- registering -----------------------------------------------------------------------

    def _connect_etcd(self) -> AbstractAsyncContextManager[RegistrarEtcd]:
        return EtcdClient.connect(self._endpoints, call_timeout_s=self._call_timeout_s)

    async def _register_forever(self, client: RegistrarEtcd) -> None:
        while True:
            self._session_registered = False
            try:
                await self._session(client)
            except _LeaseExpired:
                logger.info("etcd lease of %s expired: registering with a new lease", self.key)
                self._lease_id = None
                # At once after a lease that served; a lease that is gone before the first
                # heartbeat lands (something odd in etcd) backs off like an outage.
                if self._session_registered:
                    continue
            except EtcdError as error:
                self._note_outage(error)
            await trio.sleep(self._retry_s)
            self._retry_s = min(self._retry_s * 2, RETRY_MAX_S)

    async def _session(self, client: RegistrarEtcd) -> None:
        """Register, then heartbeat and renew until something fails (never returns)."""
        async with client.keep_alive() as keep_alive:
            ttl_s = 0
            if self._lease_id is not None:
                ttl_s = await self._renew(keep_alive, self._lease_id)
                if ttl_s <= 0:
                    logger.info("etcd lease of %s expired while etcd was unreachable", self.key)
                    self._lease_id = None
            if self._lease_id is None:
                lease = await client.grant_lease(self._lease_ttl_s)
                self._lease_id, ttl_s = lease.lease_id, lease.ttl_s
            lease_id = self._lease_id
            last_put = await self._read_heartbeat()
            await self._put(client, lease_id, last_put)
            refresh_at = trio.current_time() + self._refresh_s
            self._note_registered(lease_id, ttl_s)
            renew_every_s = max(MIN_INTERVAL_S, ttl_s / 3)
            next_renew = trio.current_time() + renew_every_s
            next_look = trio.current_time() + self._interval_s
            while True:
                await trio.sleep_until(min(next_renew, next_look))
                if trio.current_time() >= next_renew:
                    if await self._renew(keep_alive, lease_id) <= 0:
                        raise _LeaseExpired()
                    next_renew = trio.current_time() + renew_every_s
                if trio.current_time() >= next_look:
                    value = await self._read_heartbeat()
                    if value != last_put or trio.current_time() >= refresh_at:
                        await self._put(client, lease_id, value)
                        last_put, refresh_at = value, trio.current_time() + self._refresh_s
                    next_look = trio.current_time() + self._interval_s

    async def _read_heartbeat(self) -> bytes:
        return (await self._heartbeat()).to_json()

    async def _put(self, client: RegistrarEtcd, lease_id: int, value: bytes) -> None:
        try:
            await client.put(self.key, value, lease_id=lease_id)
        except LeaseNotFound as error:
            raise _LeaseExpired() from error
        self._puts += 1

    async def _renew(self, keep_alive: LeaseRenewer, lease_id: int) -> int:
        with trio.move_on_after(self._call_timeout_s):
            return await keep_alive.renew(lease_id)
        raise EtcdUnavailable(
            rpc="LeaseKeepAlive",
            endpoints=self._endpoints,
            reason=f"no answer within {self._call_timeout_s} s",
        )

    def _note_outage(self, error: EtcdError) -> None:
        if self._in_outage:
            logger.debug("etcd still unreachable (%s); retrying in %.1f s", error, self._retry_s)
            return
        self._in_outage = True
        logger.warning(
            "cannot register %s in etcd (%s); the worker keeps serving and retries in the "
            "background",
            self.key,
            error,
        )

    def _note_registered(self, lease_id: int, ttl_s: int) -> None:
        self._retry_s = RETRY_MIN_S
        if self._in_outage or not self._ever_registered:
            again = " again" if self._ever_registered else ""
            logger.info(
                "registered%s in etcd as %s (lease %x, TTL %d s)", again, self.key, lease_id, ttl_s
            )
        self._in_outage = False
        self._ever_registered = True
        self._session_registered = True

    # --- deregistering ---------------------------------------------------------------------

    async def _release(self, client: RegistrarEtcd) -> None:
        lease_id, self._lease_id = self._lease_id, None
        if lease_id is None:
            return
        try:
            try:
                await client.revoke_lease(lease_id)
            except LeaseNotFound:
                # Expired meanwhile, which took the key with it; delete in case it was re-put.
                await client.delete(self.key)
        except EtcdError as error:
            logger.warning(
                "could not deregister %s from etcd (%s); the key lapses with its lease within %d s",
                self.key,
                error,
                self._lease_ttl_s,
            )
            return
        logger.info("deregistered %s from etcd (lease %x revoked)", self.key, lease_id)
