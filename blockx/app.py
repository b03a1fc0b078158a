"""The worker application: profiles, and the one place that orders start and stop.

Start order: configuration -> logging -> tracing -> function code (first epoch loaded) ->
registries -> actors (watch hub, timer, slot table) -> executor pool -> gRPC
serve -> metrics port and status page (unless `metricsListenAddr` is "none")
and memory diagnostics -> ready (health SERVING) once the first executor is healthy -> etcd
registration (unless `etcdEndpoints` is "none"; an unreachable etcd never
stops the worker from serving).

Stop (first SIGINT/SIGTERM, or `stop` set): deregister from etcd (bounded by a
short timeout) -> health NOT_SERVING and the slot
table stops admitting (new slots and unactivated submits get UNAVAILABLE) ->
wait for live tasks up to `drainTimeoutMs` -> end what is left (each task
converges to a terminal result that its watchers receive) -> stop executors
-> close watch streams after they deliver what they hold -> stop the server
(the shadow sender with it) -> close the metrics port -> flush trace spans.
A second signal exits at once; executors notice their closed sockets and exit.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from importlib import metadata

import attrs
import trio
import trio_asyncio
from opentelemetry.trace import Tracer

from blockx._process import tune_gc
from blockx.actors import (
    Admission,
    ExecutorPool,
    ForceDrain,
    SlotTableActor,
    StartDrain,
    TaskRuntime,
    TimerActor,
    WatchHub,
    WorkerClock,
)
from blockx.actors._messages import CloseAllStreams
from blockx.actors._task import CallRunner
from blockx.api import GrpcFrontEnd, RpcObserver, WorkerIdentity, WorkerService
from blockx.api._shadow import ShadowForwarder
from blockx.config import ConfigError, WorkerConfig, load_config
from blockx.discovery import Registrar, WorkerHeartbeat, heartbeat_of
from blockx.executors import ExecutorView
from blockx.functions import (
    DirectorySource,
    FunctionCodeView,
    FunctionSource,
    MemorySource,
    RedisSource,
    run_code_refresher,
)
from blockx.observability.logs import log_task_finished, setup_logging
from blockx.observability.metrics import WorkerMetrics, WorkerProbe, log_memory_diagnostics
from blockx.observability.status_page import StatusServer
from blockx.observability.tracing import open_tracing
from blockx.phases.builders import builder_registry
from blockx.phases.plugins import writer_registry
from blockx.slots import SlotMachine

logger = logging.getLogger("blockx.app")

DEPLOYMENTS = {"block": "/workers/", "bundle": "/bundle-workers/"}
"""Each deployment's registry prefix ends with its own segment."""
STREAM_CLOSE_GRACE_S = 2.0
SERVER_STOP_GRACE_S = 5.0


@attrs.frozen(kw_only=True)
class Profile:
    """A kind of worker: what it registers as and which builders and writers it has."""

    deployment: str
    service: str
    registry_prefix: str
    builders: tuple[str, ...]
    writers: tuple[str, ...]
    tune: Callable[[WorkerConfig], WorkerConfig] = lambda config: config
    """Changes built-in defaults only; the file, environment and flags still win."""

    def check(self, config: WorkerConfig) -> None:
        """Raise ConfigError unless `config` fits this profile."""
        segment = DEPLOYMENTS.get(self.deployment)
        if segment is None:
            raise ConfigError(
                field="profile",
                value=self.deployment,
                allowed=f"one of {', '.join(sorted(DEPLOYMENTS))}",
            )
        prefix = config.worker_registry_prefix
        if not (prefix.startswith("/") and prefix.endswith(segment)):
            raise ConfigError(
                field="workerRegistryPrefix",
                value=prefix,
                allowed=f"the {self.deployment} profile registers under a prefix ending "
                f"{segment!r} (default {self.registry_prefix!r})",
            )


def _tune_bundle(config: WorkerConfig) -> WorkerConfig:
    return attrs.evolve(
        config,
        worker_registry_prefix="/blockx/bundle-workers/",
        stream_build=attrs.evolve(config.stream_build, enabled=True),
    )


BLOCK = Profile(
    deployment="block",
    service="blockx-worker",
    registry_prefix="/blockx/workers/",
    builders=("call_list", "static", "payload"),
    writers=("log", "test", "jsonl"),
)
BUNDLE = Profile(
    deployment="bundle",
    service="blockx-bundle-worker",
    registry_prefix="/blockx/bundle-workers/",
    builders=("call_list",),
    writers=("log", "jsonl"),
    tune=_tune_bundle,
)
PROFILES = {profile.deployment: profile for profile in (BLOCK, BUNDLE)}


def version() -> str:
    try:
        return metadata.version("blockx")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@attrs.frozen(kw_only=True)
class Serving:
    """What `serve` hands to `nursery.start` once the server listens."""

    port: int
    worker_addr: str
    ready: trio.Event
    slot_table: SlotTableActor
    front_end: GrpcFrontEnd
    metrics_port: int | None = None
    """The bound metrics and status-page port; None when `metricsListenAddr` turns it off."""


def function_source(config: WorkerConfig) -> FunctionSource:
    code = config.function_code
    if code.redis_url:
        return RedisSource(code.redis_url, code.redis_prefix)
    return DirectorySource(code.dir)


async def serve(  # noqa: PLR0915 - the one place that orders start and stop, read top down
    config: WorkerConfig,
    profile: Profile,
    *,
    stop: trio.Event,
    source: FunctionSource | None = None,
    executors: AbstractAsyncContextManager[CallRunner] | None = None,
    executor_views: Callable[[], tuple[ExecutorView, ...]] | None = None,
    tracer: Tracer | None = None,
    task_status: trio.TaskStatus[Serving] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one worker until `stop` is set, then shut it down in order.

    `source`, `executors` and `executor_views` replace the configured
    function source and the executor pool (tests use in-memory code and fake
    executors); by default they come from `config`. `tracer` replaces the
    one `otelExporterEndpoint` asks for (tests pass an in-memory SDK tracer).
    """
    profile.check(config)
    shadow = ShadowForwarder.from_config(config)
    builders = builder_registry(profile.builders)
    writers = writer_registry(profile.writers)
    clock = WorkerClock()
    started_at_ms = clock.now_ms()
    tracing_cm = open_tracing(
        config.otel_exporter_endpoint, service=profile.service, version=version(), tracer=tracer
    )
    async with trio_asyncio.open_loop(), tracing_cm as tracing, trio.open_nursery() as system:
        view = FunctionCodeView(config.code_view_config())
        epoch = await system.start(
            functools.partial(
                run_code_refresher,
                view,
                source or function_source(config),
                interval_s=config.function_code.refresh_ms / 1000,
                clock_ms=clock.now_ms,
                # In-memory code is read on the Trio thread: exact under a virtual clock.
                use_thread=not isinstance(source, MemorySource),
            )
        )
        logger.info("function code epoch %s loaded", epoch)
        hub = WatchHub(to_slot_table=lambda message: slot_table.post(message))  # noqa: PLW0108
        metrics = WorkerMetrics() if config.metrics_enabled else None
        slot_table = SlotTableActor(
            SlotMachine(config.slot_config()),
            clock=clock,
            to_hub=hub.post,
            on_finished=(
                log_task_finished,
                tracing.task_finished,
                *((metrics.task_finished,) if metrics is not None else ()),
            ),
        )
        timer = TimerActor(clock=clock, to_slot_table=slot_table.post)
        system.start_soon(hub.run)
        system.start_soon(timer.run)

        pool: ExecutorPool | None = None
        if executors is None:
            pool = ExecutorPool(
                pool_config=config.pool_config(),
                code_view=view,
                executor_capacity=config.dispatcher.executor_capacity,
            )
            executors = pool
            executor_views = pool.manager.snapshot
        ready = trio.Event()
        async with executors as calls:
            if pool is not None:
                system.start_soon(_wait_first_executor, pool, ready)
            else:
                ready.set()
            async with trio.open_nursery() as tasks:
                runtime = TaskRuntime(
                    clock=clock,
                    code_view=view,
                    calls=calls,
                    builders=builders,
                    writers=writers,
                    admission=Admission.of(
                        builder=config.admission.builder_slots,
                        executor=config.admission.executor_task_slots,
                        plugin=config.admission.plugin_slots,
                        scan=config.admission.scan_slots,
                    ),
                    phase_io_timeout_ms=config.phase_io_timeout_ms,
                    call_window=config.dispatcher.call_window,
                    call_deadline_ms=config.dispatcher.call_deadline_ms,
                    to_slot_table=slot_table.post,
                    tracing=tracing,
                )
                system.start_soon(
                    functools.partial(
                        slot_table.run, runtime=runtime, timer=timer, task_nursery=tasks
                    )
                )
                host, port = config.listen_host_port()
                front_end = _front_end(
                    config=config,
                    profile=profile,
                    slot_table=slot_table,
                    hub=hub,
                    ready=ready,
                    executor_views=executor_views,
                    started_at_ms=started_at_ms,
                    shadow=shadow,
                    on_rpc=metrics.rpc_finished if metrics is not None else None,
                )
                if shadow is not None:
                    await system.start(shadow.run)
                bound = await front_end.start(host, port)
                worker_addr = config.resolve_worker_addr(bound)
                front_end.service.identity = attrs.evolve(
                    front_end.service.identity, worker_addr=worker_addr
                )
                probe = WorkerProbe(
                    machine=slot_table.machine,
                    now_ms=clock.now_ms,
                    stream_count=lambda: hub.stream_count,
                    executor_views=executor_views or tuple,
                    worker_addr=worker_addr,
                    deployment=profile.deployment,
                    version=version(),
                    started_at_ms=started_at_ms,
                )
                metrics_port = await _start_observing(system, config, metrics, probe)
                registrar = _registrar(config, probe)
                system.start_soon(
                    functools.partial(
                        _announce_ready,
                        ready,
                        front_end,
                        worker_addr,
                        profile,
                        config,
                        registrar=registrar,
                    )
                )
                task_status.started(
                    Serving(
                        port=bound,
                        worker_addr=worker_addr,
                        ready=ready,
                        slot_table=slot_table,
                        front_end=front_end,
                        metrics_port=metrics_port,
                    )
                )
                await stop.wait()
                await _drain(config, slot_table, front_end, registrar)
            # Every task actor has ended; executors stop next.
        hub.post(CloseAllStreams())
        with trio.move_on_after(STREAM_CLOSE_GRACE_S):
            await hub.all_closed()
        await front_end.stop(SERVER_STOP_GRACE_S)
        system.cancel_scope.cancel()
    logger.info("worker stopped")


def _front_end(
    *,
    config: WorkerConfig,
    profile: Profile,
    slot_table: SlotTableActor,
    hub: WatchHub,
    ready: trio.Event,
    executor_views: Callable[[], tuple[ExecutorView, ...]] | None,
    started_at_ms: int,
    shadow: ShadowForwarder | None,
    on_rpc: RpcObserver | None,
) -> GrpcFrontEnd:
    service = WorkerService(
        slot_table=slot_table,
        hub=hub,
        identity=WorkerIdentity(
            worker_addr=config.worker_addr,
            deployment=profile.deployment,
            version=version(),
            started_at_ms=started_at_ms,
        ),
        executors=executor_views or tuple,
        ready=ready.is_set,
        shadow=shadow,
    )
    return GrpcFrontEnd(
        service,
        max_message_bytes=config.grpc_max_message_bytes,
        keepalive_time_ms=config.grpc_keepalive_time_ms,
        keepalive_timeout_ms=config.grpc_keepalive_timeout_ms,
        on_rpc=on_rpc,
    )


async def _start_observing(
    system: trio.Nursery, config: WorkerConfig, metrics: WorkerMetrics | None, probe: WorkerProbe
) -> int | None:
    """Memory diagnostics, and the metrics port if configured; returns its bound port.

    Both run in the system nursery, so they stop last, once the server has.
    """
    system.start_soon(
        functools.partial(
            log_memory_diagnostics, probe, interval_ms=config.memory_diagnostics_interval_ms
        )
    )
    if metrics is None:
        return None
    metrics.observe(probe)
    host, port = config.metrics_host_port()
    bound: int = await system.start(StatusServer(metrics=metrics, probe=probe).run, host, port)
    logger.info("metrics on http://%s:%d/metrics, status page on /", host, bound)
    return bound


def _registrar(config: WorkerConfig, probe: WorkerProbe) -> Registrar | None:
    """The etcd registration of this worker; None when `etcdEndpoints` turns it off."""
    if not config.etcd_enabled:
        return None

    def heartbeat() -> WorkerHeartbeat:
        # Read on the Trio thread between the slot table's steps: a consistent view.
        return heartbeat_of(
            probe.machine.heartbeat(probe.now_ms()),
            address=probe.worker_addr,
            deployment=probe.deployment,
            version=probe.version,
            started_at_ms=probe.started_at_ms,
            executors=probe.executor_views(),
        )

    return Registrar(
        endpoints=config.etcd_endpoints,
        key=config.worker_registry_prefix + probe.worker_addr,
        lease_ttl_ms=config.etcd_lease_ttl_ms,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
        heartbeat=heartbeat,
    )


async def _wait_first_executor(pool: ExecutorPool, ready: trio.Event) -> None:
    await pool.wait_ready()
    ready.set()


async def _announce_ready(
    ready: trio.Event,
    front_end: GrpcFrontEnd,
    worker_addr: str,
    profile: Profile,
    config: WorkerConfig,
    *,
    registrar: Registrar | None = None,
) -> None:
    await ready.wait()
    if front_end.service.closing:
        return
    front_end.set_serving(True)
    logger.info(
        "worker ready on %s (listening %s; profile %s, %d slots, %d executors)",
        worker_addr,
        config.listen_addr,
        profile.deployment,
        config.worker.task_slots,
        config.executor_count,
    )
    if registrar is not None:
        await registrar.run()  # until the drain deregisters


async def _drain(
    config: WorkerConfig,
    slot_table: SlotTableActor,
    front_end: GrpcFrontEnd,
    registrar: Registrar | None = None,
) -> None:
    if registrar is not None:
        # Coordinators stop placing here first; bounded, so a dead etcd never holds us up.
        await registrar.deregister()
    front_end.set_serving(False)
    slot_table.post(StartDrain())
    logger.info("draining: waiting up to %d ms for live tasks", config.drain_timeout_ms)
    with trio.move_on_after(config.drain_timeout_ms / 1000):
        await slot_table.drained.wait()
    if not slot_table.drained.is_set():
        logger.warning("drain timeout passed: ending the tasks still live")
        slot_table.post(ForceDrain())
        await slot_table.drained.wait()


# ------------------------------------------------------------------ process


def run(
    profile: Profile,
    *,
    overrides: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """The worker process: load configuration, serve until signalled. Returns the exit status."""
    config = load_config(tune=profile.tune, env=env, overrides=overrides)
    profile.check(config)
    setup_logging(config.log_format)
    tune_gc()
    trio.run(_main, config, profile)
    return 0


async def _main(config: WorkerConfig, profile: Profile) -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, stop)
        await serve(config, profile, stop=stop)
        nursery.cancel_scope.cancel()


async def _watch_signals(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if not stop.is_set():
                logger.info("%s: shutting down (send it again to exit at once)", _name(signum))
                stop.set()
                continue
            logger.warning("%s again: exiting at once", _name(signum))
            sys.stderr.flush()
            os._exit(128 + signum)


def _name(signum: int) -> str:
    return signal.Signals(signum).name
