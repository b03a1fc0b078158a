"""The worker application: the one place that orders start and stop, read top down.

Start: check that a function-code directory and the TLS files can be read ->
bind the gRPC port (the worker's address, and with it its identity) and the
metrics port (either of these failing is a one-line StartupError, before
anything runs) ->
tracing -> function code (first epoch loaded) -> actors (watch fan-out,
executors, dispatcher, slot table) -> gRPC serve (and the shadow sender) ->
status page on the metrics port (unless `metricsListenAddr` is "none") and
memory diagnostics -> ready (the slot table admits work, health SERVING) once
the first executor is healthy -> etcd registration (unless `etcdEndpoints` is
"none"; an unreachable etcd never stops the worker from serving); the hub
session, with `hubUrl` (`blockx.hubnode`: offered nothing until a slot admits
work). `stop` set at any point of the start cancels it.

Stop (first SIGINT/SIGTERM, `stop` set, or a hub session that cannot go on):
health NOT_SERVING, the hub session drains (no new grants) and the slot
table stops admitting (new slots and unactivated submits get UNAVAILABLE) ->
deregister from etcd (bounded by a short timeout) -> wait for live tasks up to
`drainTimeoutMs` -> end what is left (each task converges to a terminal
result that its watchers receive) -> the hub confirms the last results (up to
`CONFIRM_MS`) -> stop executors -> close watch streams
after they deliver what they hold -> stop the server -> close the metrics port
-> flush trace spans. A second signal exits at once (the same signal again
within a second is the same request: see `blockx.process.signals`), removing the
executors' runtime directory; executors ignore signals, notice their closed
sockets and exit.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import shutil
import socket
import ssl
import time
from collections.abc import Mapping
from typing import Final

import attrs
import trio
import trio_asyncio
from opentelemetry.trace import Tracer

from blockx.actors import (
    ActorParts,
    ActorProbe,
    CloseAllStreams,
    FreeSlots,
    Inbox,
    Inboxes,
    SlotTableMessage,
    TransportFactory,
    WorkerActors,
    run_actors,
)
from blockx.api import GrpcFrontEnd, WorkerService, bind_listener
from blockx.autoworker import HubClient, hub_client_of
from blockx.client import ClientSettings, ShadowForwarder
from blockx.config import WorkerConfig, load_config
from blockx.discovery import Registrar, WorkerHeartbeat, heartbeat_of
from blockx.errors import BlockxError, InvalidValue, StartupError
from blockx.executors import ExecutorPoolManager
from blockx.functions import (
    DirectorySource,
    FunctionCodeView,
    FunctionSnapshot,
    FunctionSource,
    MemorySource,
    RedisSource,
    run_code_refresher,
)
from blockx.hubnode import CONFIRM_MS, HubFeed
from blockx.identity import WorkerIdentity, version
from blockx.net.auth import bearer_token
from blockx.net.tls import server_context
from blockx.observability.logs import (
    LOG_FLUSH_S,
    flush_logs,
    lean_records,
    log_task_finished,
    setup_logging,
)
from blockx.observability.metrics import WorkerMetrics, log_memory_diagnostics
from blockx.observability.status_page import StatusServer
from blockx.observability.tracing import TaskTracing, open_tracing
from blockx.process.clock import EpochClock
from blockx.process.lifecycle import lone_errors, tune_gc
from blockx.process.signals import watch_signals
from blockx.profiles import Profile
from blockx.settings import ConfigError, parse_listen_addr

logger = logging.getLogger("blockx.app")

METRICS_PORT_HINT = " (the metrics port: set METRICS_LISTEN to another address, or to none)"
STREAM_CLOSE_GRACE_S = 2.0
SERVER_STOP_GRACE_S = 5.0


@attrs.frozen(kw_only=True)
class Serving:
    """What `serve` hands to `nursery.start` once the server listens."""

    port: int
    worker_addr: str
    ready: trio.Event
    slot_table: Inbox[SlotTableMessage]
    free_slots: FreeSlots
    front_end: GrpcFrontEnd
    metrics_port: int | None = None
    """The bound metrics and status-page port; None when `metricsListenAddr` turns it off."""

    @classmethod
    def of(
        cls,
        listener: socket.socket,
        actors: WorkerActors,
        front_end: GrpcFrontEnd,
        metrics_port: int | None,
    ) -> Serving:
        return cls(
            port=int(listener.getsockname()[1]),
            worker_addr=actors.probe.identity.worker_addr,
            ready=front_end.first_serving,
            slot_table=actors.inboxes.slot_table,
            free_slots=actors.free_slots,
            front_end=front_end,
            metrics_port=metrics_port,
        )


async def serve(
    config: WorkerConfig,
    profile: Profile,
    *,
    stop: trio.Event,
    source: FunctionSource | None = None,
    executors: TransportFactory = ExecutorPoolManager,
    tracer: Tracer | None = None,
    client: ClientSettings | None = None,
    task_status: trio.TaskStatus[Serving] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one worker until `stop` is set, then shut it down in order (`stop` set during
    start-up abandons it); what cannot start raises StartupError or ConfigError first.
    `source`, `executors`, `tracer` stand in for the configured ones (tests); `client`: how
    the shadow sender reaches its target (default: plain text)."""
    profile.check(config)
    clock = EpochClock()
    checked = _check_start(config, source)
    members: _Members | None = None
    with contextlib.ExitStack() as held:  # sockets, the CPU pin: released however it ends
        listener, metrics_socket = _bind_all(config, held)
        identity = _identity(config, profile, clock, listener)
        shadow = _shadow(config, identity, checked.token, client)  # a bad target: refused at once
        tracing_cm = _tracing(config, profile, identity, tracer)
        async with trio_asyncio.open_loop(), tracing_cm as tracing, trio.open_nursery() as system:
            started = trio.Event()
            with trio.CancelScope() as starting:
                system.start_soon(_abandon_start_on, stop, started, starting)
                inboxes = Inboxes()
                code = await _load_code(system, config, checked, inboxes, clock)
                metrics = WorkerMetrics(identity.started_at_ms) if metrics_socket else None
                parts = ActorParts(
                    config=config,
                    profile=profile,
                    inboxes=inboxes,
                    code=code,
                    executors=executors,
                    identity=identity,
                    clock=clock,
                    tracing=tracing,
                    on_finished=(log_task_finished, *([metrics.task_finished] if metrics else [])),
                )
                async with run_actors(system, parts) as actors:
                    if shadow is not None:
                        await system.start(shadow.run)
                    front_end = await _serve_rpcs(
                        config, actors, listener, metrics, shadow, checked=checked
                    )
                    held.callback(front_end.release)
                    observing = (metrics, metrics_socket)
                    metrics_port, members = await _open(
                        system, config, actors, front_end, observing, checked=checked, stop=stop
                    )
                    started.set()
                    task_status.started(Serving.of(listener, actors, front_end, metrics_port))
                    await stop.wait()
                    await _drain(config, actors, front_end, members)
                await _stop_serving(actors, front_end)  # task actors and executors have ended
            system.cancel_scope.cancel()
    _stopped(started, members)


def _stopped(started: trio.Event, members: _Members | None) -> None:
    """Log the end; raise what stopped the worker, if its hub session did."""
    logger.info("worker stopped" if started.is_set() else "worker stopped during start-up")
    if members is not None and members.feed is not None and members.feed.failure is not None:
        raise members.feed.failure


async def _abandon_start_on(
    stop: trio.Event, started: trio.Event, starting: trio.CancelScope
) -> None:
    """`stop` set before the worker started (code still loading, executors still
    spawning) cancels the start; once started, `stop` begins the drain instead."""
    await stop.wait()
    if not started.is_set():
        starting.cancel()


def _hub_client(config: WorkerConfig) -> HubClient | None:
    """The client of the hub `hubUrl` names, its credential read; None without one. A
    credential file that cannot be read, or a URL that is not a hub's, stops the start."""
    hub = config.hub
    if not hub.enabled:
        return None
    try:
        return hub_client_of(hub.url, hub.credential_file, ca_file=hub.ca_file)
    except InvalidValue as error:
        field = _SETTING_OF.get(error.field, "hubUrl")
        raise ConfigError(field=field, value=error.value, allowed=error.allowed) from None


_SETTING_OF: Final = {"credential_file": "hubCredentialFile", "ca_file": "hubCaFile"}


@attrs.frozen
class _Members:
    """How the worker takes part in a fleet: its etcd registration and its hub session
    (each None when turned off)."""

    registrar: Registrar | None
    feed: HubFeed | None


def _join(
    system: trio.Nursery,
    config: WorkerConfig,
    actors: WorkerActors,
    front_end: GrpcFrontEnd,
    *,
    feed: HubFeed | None,
    stop: trio.Event,
) -> _Members:
    """Announce the worker once ready (health, etcd), and start its hub session."""
    registrar = _registrar(config, actors.probe)
    system.start_soon(_announce_ready, actors, front_end, config, registrar, stop)
    if feed is not None:
        system.start_soon(_feed_from_hub, config, feed, stop)
    return _Members(registrar, feed)


def _hub_feed(config: WorkerConfig, actors: WorkerActors, checked: _Checked) -> HubFeed | None:
    """The node's hub session, if it takes tasks from a hub (not started yet)."""
    if checked.hub is None:
        return None
    return HubFeed(
        client=checked.hub,
        queue_id=config.hub.queue,
        deployment=actors.probe.identity.deployment,
        slot_table=actors.inboxes.slot_table,
        free_slots=actors.free_slots,
        slots=config.worker.task_slots,
        drain_timeout_ms=config.drain_timeout_ms,
        clock=actors.probe.clock,
    )


async def _feed_from_hub(config: WorkerConfig, feed: HubFeed, stop: trio.Event) -> None:
    """The hub session, until the drain ends it; a failure that retrying cannot heal (the
    hub refused the credential, ...) stops the node, which then exits with it."""
    logger.info("taking tasks of queue %s from hub %s", config.hub.queue, config.hub.url)
    await feed.run()
    if feed.failure is not None:
        logger.error("hub session ended: %s", feed.failure)
        stop.set()


def _bind_all(
    config: WorkerConfig, sockets: contextlib.ExitStack
) -> tuple[socket.socket, socket.socket | None]:
    """The gRPC socket and the metrics socket (None when turned off), bound before
    anything starts so that a taken port stops the start at once."""
    listener = sockets.enter_context(_bind(config.listen_addr))
    if not config.observability.metrics_enabled:
        return listener, None
    metrics_addr = config.observability.metrics_listen_addr
    return listener, sockets.enter_context(_bind(metrics_addr, hint=METRICS_PORT_HINT))


def _bind(addr: str, *, hint: str = "") -> socket.socket:
    host, port = parse_listen_addr(addr)
    try:
        return bind_listener(host, port)
    except OSError as error:
        reason = (error.strerror or str(error)).lower()
        raise StartupError(f"cannot listen on {host}:{port}: {reason}{hint}") from None


@attrs.frozen(kw_only=True)
class _Checked:
    """What `_check_start` read, for the start."""

    source: FunctionSource
    first: FunctionSnapshot | None
    """The code source's first snapshot, if it was read."""
    tls: ssl.SSLContext | None
    """The gRPC port's TLS context; None for plain text."""
    token: str | None
    hub: HubClient | None


def _check_start(config: WorkerConfig, given: FunctionSource | None) -> _Checked:
    """What would fail only later, checked before anything starts: the executors'
    interpreter, the function code (`_code_source`), the TLS files (`_server_tls`), the
    bearer token's file and the hub's credential file (`_hub_client`)."""
    _check_executor_python(config)
    source, first = _code_source(config, given)
    grpc = config.grpc
    return _Checked(
        source=source,
        first=first,
        tls=_server_tls(config),
        token=bearer_token(grpc.auth_token, grpc.auth_token_file),
        hub=_hub_client(config),
    )


def _check_executor_python(config: WorkerConfig) -> None:
    """An `executorPython` that cannot be run stops the start at once: executors would
    only fail to spawn, again and again."""
    python = config.executor.python
    if python and shutil.which(python) is None:
        raise StartupError(
            f"cannot start executors: executorPython {python!r} is not an executable file"
        )


def _code_source(
    config: WorkerConfig, given: FunctionSource | None
) -> tuple[FunctionSource, FunctionSnapshot | None]:
    """`given`, else the configured source; with a directory, also its first snapshot. A
    directory that cannot be read stops the start at once (a Redis source is waited
    for: the server may come up later)."""
    if given is not None:
        return given, None
    source = function_source(config)
    if isinstance(source, DirectorySource):
        try:
            return source, source.read()
        except BlockxError as error:
            where = os.path.abspath(config.function_code.dir)
            raise StartupError(
                f"cannot read function code from {where}: {error} (set --functions DIR or "
                "FUNCTIONS_DIR; a relative path is from the current directory)"
            ) from None
    return source, None


def _server_tls(config: WorkerConfig) -> ssl.SSLContext | None:
    """The gRPC port's TLS context, or None for plain text. A file that cannot be read or
    holds the wrong thing stops the start at once (a ConfigError naming its setting)."""
    grpc = config.grpc
    context = server_context(*grpc.tls_files())
    if context is not None:
        clients = (
            f"required, signed by a CA of {grpc.tls_client_ca_file} (mutual TLS)"
            if grpc.tls_client_ca_file
            else "not asked for"
        )
        logger.info(
            "gRPC port serves TLS with %s; client certificates %s", grpc.tls_cert_file, clients
        )
    return context


def _tracing(
    config: WorkerConfig, profile: Profile, identity: WorkerIdentity, tracer: Tracer | None
) -> contextlib.AbstractAsyncContextManager[TaskTracing]:
    return open_tracing(
        config.observability.otel_exporter_endpoint,
        service=profile.service,
        version=identity.version,
        tracer=tracer,
    )


def _identity(
    config: WorkerConfig, profile: Profile, clock: EpochClock, listener: socket.socket
) -> WorkerIdentity:
    return WorkerIdentity(
        worker_addr=config.resolve_worker_addr(int(listener.getsockname()[1])),
        deployment=profile.deployment,
        version=version(),
        started_at_ms=clock.now_ms(),
    )


def function_source(config: WorkerConfig) -> FunctionSource:
    code = config.function_code
    if code.redis_url:
        return RedisSource(code.redis_url, code.redis_prefix)
    return DirectorySource(code.dir)


async def _load_code(
    system: trio.Nursery,
    config: WorkerConfig,
    checked: _Checked,
    inboxes: Inboxes,
    clock: EpochClock,
) -> FunctionCodeView:
    """The code view, holding the first snapshot (`checked.first` if read already);
    the refresher then feeds the slot table."""
    loaded: FunctionSnapshot = await system.start(
        functools.partial(
            run_code_refresher,
            checked.source,
            inboxes.code_loaded,
            interval_s=config.function_code.refresh_ms / 1000,
            # In-memory code is read on the Trio thread: exact under a virtual clock.
            use_thread=not isinstance(checked.source, MemorySource),
            first=checked.first,
        )
    )
    logger.info("function code epoch %s loaded", loaded.epoch)
    view = FunctionCodeView(config.code_view_config())
    view.observe(loaded, clock.now_ms())
    return view


async def _serve_rpcs(
    config: WorkerConfig,
    actors: WorkerActors,
    listener: socket.socket,
    metrics: WorkerMetrics | None,
    shadow: ShadowForwarder | None,
    *,
    checked: _Checked,
) -> GrpcFrontEnd:
    """The gRPC server on `listener`, over TLS and asking for the bearer token `checked`
    holds (if any); accepted submits feed `shadow`, if any."""
    service = WorkerService(
        slot_table=actors.inboxes.slot_table,
        identity=actors.probe.identity,
        executors=actors.transport.snapshot,
        ready=lambda: actors.readiness.ready,
        retained=actors.retained,
        shadow=shadow.offer if shadow is not None else None,
    )
    front_end = GrpcFrontEnd(
        service,
        config.grpc,
        on_rpc=metrics.rpc_finished if metrics is not None else None,
        on_connection_closed=metrics.grpc_connection_closed if metrics is not None else None,
        tls=checked.tls,
        token=checked.token,
    )
    await front_end.start(listener)
    return front_end


def _shadow(
    config: WorkerConfig,
    identity: WorkerIdentity,
    token: str | None,
    client: ClientSettings | None,
) -> ShadowForwarder | None:
    """The shadow sender `shadowSubmit*` asks for, or None. It presents this worker's
    bearer `token` (a fleet shares one) and speaks TLS as the command line does, when a
    client variable (`WORKER_TLS_CA_FILE`, ...) is set in `client`; the files are read as
    it starts."""
    shadow = config.shadow
    if not shadow.enabled:
        return None
    tls = None if client is None else client.tls()
    if tls is not None:
        tls.context()  # its files are read now: one that cannot be stops the start
    try:
        return ShadowForwarder(
            target_addr=shadow.target_addr,
            sample_rate=shadow.sample_rate,
            source_addr=identity.worker_addr,
            token=token,
            tls=tls,
        )
    except BlockxError as error:
        raise ConfigError(
            field="shadowSubmitTargetAddr",
            value=shadow.target_addr,
            allowed="must be the HOST:PORT of a worker, port 1-65535",
        ) from error


async def _open(
    system: trio.Nursery,
    config: WorkerConfig,
    actors: WorkerActors,
    front_end: GrpcFrontEnd,
    observing: tuple[WorkerMetrics | None, socket.socket | None],
    *,
    checked: _Checked,
    stop: trio.Event,
) -> tuple[int | None, _Members]:
    """Open the worker to the world once it serves: the metrics port (its bound port, if
    configured), then its fleet: ready announced, etcd, the hub session."""
    feed = _hub_feed(config, actors, checked)
    metrics, metrics_socket = observing
    metrics_port = await _start_observing(
        system, config, metrics, metrics_socket, actors.probe, hub=feed
    )
    return metrics_port, _join(system, config, actors, front_end, feed=feed, stop=stop)


async def _start_observing(
    system: trio.Nursery,
    config: WorkerConfig,
    metrics: WorkerMetrics | None,
    metrics_socket: socket.socket | None,
    probe: ActorProbe,
    *,
    hub: HubFeed | None,
) -> int | None:
    """Memory diagnostics, and the metrics port if configured; returns its bound port.

    Both run in the system nursery, so they stop last, once the server has.
    """
    observability = config.observability
    system.start_soon(
        functools.partial(
            log_memory_diagnostics, probe, interval_ms=observability.memory_diagnostics_interval_ms
        )
    )
    if metrics is None or metrics_socket is None:
        return None
    server = StatusServer(metrics=metrics, probe=probe, hub=None if hub is None else hub.status)
    bound: int = await system.start(server.run, metrics_socket)
    host = observability.metrics_host_port()[0]
    logger.info("metrics on http://%s:%d/metrics, status page on /", host, bound)
    return bound


def _registrar(config: WorkerConfig, probe: ActorProbe) -> Registrar | None:
    """The etcd registration of this worker; None when `etcdEndpoints` turns it off."""
    etcd = config.etcd
    if not etcd.enabled:
        return None

    async def heartbeat() -> WorkerHeartbeat:
        snapshot = await probe.snapshot()
        return heartbeat_of(snapshot.heartbeat, snapshot.identity, snapshot.executors)

    return Registrar(
        endpoints=etcd.endpoints,
        key=etcd.registry_prefix + probe.identity.worker_addr,
        lease_ttl_ms=etcd.lease_ttl_ms,
        heartbeat_interval_ms=etcd.heartbeat_interval_ms,
        heartbeat_refresh_ms=etcd.heartbeat_refresh_ms,
        heartbeat=heartbeat,
    )


async def _announce_ready(
    actors: WorkerActors,
    front_end: GrpcFrontEnd,
    config: WorkerConfig,
    registrar: Registrar | None,
    stop: trio.Event,
) -> None:
    await actors.readiness.wait_until(True)
    if stop.is_set():
        return
    front_end.set_serving(True)
    logger.info(
        "worker ready on %s (listening %s; profile %s, %d slots, %d executors)",
        actors.probe.identity.worker_addr,
        config.listen_addr,
        actors.probe.identity.deployment,
        config.worker.task_slots,
        config.executor.count,
    )
    flush_logs()  # what process managers and scripts wait for: never held
    async with trio.open_nursery() as nursery:
        if registrar is not None:
            nursery.start_soon(registrar.run)  # until the drain deregisters
        await _follow_readiness(actors, front_end, stop)


async def _follow_readiness(
    actors: WorkerActors, front_end: GrpcFrontEnd, stop: trio.Event
) -> None:
    """Health follows the executors: NOT_SERVING while none is up (every one crashed and
    the pool backs off before restarting them), SERVING again once one is; the slot
    table refuses new work meanwhile. Ends when the worker stops."""
    readiness = actors.readiness
    while True:
        await readiness.wait_until(False)
        if stop.is_set():
            return
        front_end.set_serving(False)
        logger.warning("no executor is up: the worker admits no new work until one restarts")
        await readiness.wait_until(True)
        if stop.is_set():
            return
        front_end.set_serving(True)
        logger.info("an executor is up again: the worker admits work")


async def _stop_serving(actors: WorkerActors, front_end: GrpcFrontEnd) -> None:
    """Watch streams end once they delivered what they hold; then the server stops."""
    actors.inboxes.slot_table.post(CloseAllStreams())
    with trio.move_on_after(STREAM_CLOSE_GRACE_S):
        await actors.fanout.all_closed()
    await front_end.stop(SERVER_STOP_GRACE_S)


async def _drain(
    config: WorkerConfig,
    actors: WorkerActors,
    front_end: GrpcFrontEnd,
    members: _Members,
) -> None:
    # Stop admitting, then leave etcd, then wait for live tasks: a coordinator still
    # placing here in between gets UNAVAILABLE and places elsewhere; the hub grants
    # nothing more, and hears how every task it granted ended.
    front_end.set_serving(False)
    registrar, feed = members.registrar, members.feed
    if feed is not None:
        feed.stop()
    actors.start_drain()
    logger.info("draining: admitting no new tasks")
    if registrar is not None:
        await registrar.deregister()  # bounded, so a dead etcd never holds us up
    logger.info("draining: waiting up to %d ms for live tasks", config.drain_timeout_ms)
    if await actors.finish_drain(config.drain_timeout_ms):
        logger.warning("drain timeout passed: ended the tasks still live")
    if feed is not None:
        with trio.move_on_after(CONFIRM_MS / 1000):
            await feed.finished.wait()


# ------------------------------------------------------------------ process


def run(
    profile: Profile,
    *,
    overrides: Mapping[str, object] | None = None,
    flags: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    file: str | None = None,
) -> int:
    """The worker process: load configuration, serve until signalled. Returns the exit status.
    `flags` names the command-line flag of each override, for errors; `file` is the
    configuration file a flag named (see `load_config`).

    A failure to start (BlockxError) is raised as itself, never inside an exception group,
    so that the command line reports it as one line."""
    config = load_config(
        profile=profile.defaults, env=env, overrides=overrides, flags=flags, file=file
    )
    profile.check(config)
    client = ClientSettings.load(env)
    setup_logging(config.observability.log_format, hold=True)
    lean_records()
    tune_gc()
    with lone_errors(BlockxError):
        trio.run(_main, config, profile, client)
    return 0


async def _main(config: WorkerConfig, profile: Profile, client: ClientSettings) -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_signals, stop)
        nursery.start_soon(_flush_logs)
        nursery.start_soon(_collect_garbage, config.gc_collect_interval_ms)
        await serve(config, profile, stop=stop, client=client)
        nursery.cancel_scope.cancel()
    flush_logs()


async def _collect_garbage(interval_ms: int) -> None:
    """A full garbage collection every `interval_ms`, until cancelled.

    `tune_gc` makes the young generation rare, and the older ones rarer still:
    under a steady load the oldest came round once in hours, and the reference
    cycles that reached it meanwhile (grpclib leaves some behind every RPC its
    client cancels, a refused request one per exception) grew the worker's RSS
    by megabytes a minute (bench/soak.py). On a clock they stay bounded, for a
    pause of tens of milliseconds a minute.
    """
    while True:
        await trio.sleep(interval_ms / 1000)
        started_s = time.perf_counter()
        unreachable = gc.collect()
        pause_ms = (time.perf_counter() - started_s) * 1000
        logger.info(
            "garbage collection: %d unreachable objects in %.1f ms",
            unreachable,
            pause_ms,
            extra={"gc_unreachable": unreachable, "gc_pause_ms": round(pause_ms, 1)},
        )


async def _flush_logs() -> None:
    """Held log lines out every `LOG_FLUSH_S` (see `setup_logging(hold=True)`)."""
    while True:
        await trio.sleep(LOG_FLUSH_S)
        flush_logs()
