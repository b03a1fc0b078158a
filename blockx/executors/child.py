"""The executor child process: runs the worker's calls in order, one at a time.

`python -m blockx.executors.child --socket PATH --executor-id ID` connects to
the worker's Unix socket, says Hello with the token from the environment
variable BLOCKX_EXECUTOR_TOKEN, and serves until Shutdown or until the socket
closes. Three threads: a reader demultiplexes frames, the main thread runs
calls from its queue (and, while a call waits on a subcall, runs the other
calls it receives), a ticker sends heartbeats and flushes results that have
waited too long. Every write goes through one lock.

Owns the executor side of the wire protocol, function lookup (through a
`FunctionResolver`) and subcalls. Must never import trio (the child stays a
lean, blocking program) and must never outlive its worker: end of file on the
socket ends the process at once, even mid-call (the reader thread sees it
while the main thread runs a function). The kernel closes the worker's end
when the worker dies in any way, SIGKILL included. (A parent-death signal is
no guard here: it fires when the spawning *thread* ends, and Trio spawns
processes from its thread cache, whose idle threads end after 10 s.)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NoReturn, Protocol

from blockx.calls import (
    CallOutcome,
    FailureCode,
    InvalidArguments,
    Succeeded,
    decode_args,
    decode_value,
    encode_args,
    encode_value,
)
from blockx.executors._errors import CodeUnavailable, WireError
from blockx.executors._wire import (
    PROTOCOL_VERSION,
    RECV_BYTES,
    TOKEN_ENV,
    CallRequest,
    CallResults,
    CancelCall,
    CodeReply,
    CodeRequest,
    FrameDecoder,
    Heartbeat,
    Hello,
    Message,
    RevokeCall,
    RunCalls,
    Shutdown,
    Subcall,
    SubcallResult,
    Welcome,
    encode_frames,
)
from blockx.function_api import (
    CallCancelled,
    RetryableError,
    SubcallFailed,
    bind_subcall_port,
)
from blockx.functions import (
    EpochModules,
    FunctionCodeError,
    InvalidFunctionRef,
    NotCallable,
    NotPublic,
    UnknownFunction,
    UnknownModule,
)
from blockx.process.lifecycle import rss_bytes, tune_gc

EXIT_SHUTDOWN: Final = 0
"""Exited after a Shutdown message."""
EXIT_USAGE: Final = 2
"""Bad command line or no token."""
EXIT_CONNECTION_LOST: Final = 3
"""The socket could not be opened or was closed: the worker is gone."""
EXIT_PROTOCOL_ERROR: Final = 4
"""The worker sent something that is not this protocol."""
EXIT_REJECTED: Final = 5
"""The worker closed the connection before Welcome (wrong token or id)."""
EXIT_INTERNAL_ERROR: Final = 70
"""A bug in this module; the traceback is on stderr."""

_MAX_BATCH_RESULTS: Final = 512
_MAX_BATCH_BYTES: Final = 1024 * 1024
_RESULT_FLUSH_AFTER_S: Final = 0.02
"""A finished result waits at most about this long while later calls run."""
_MAX_ERROR_MESSAGE_CHARS: Final = 8 * 1024
_KEPT_EPOCHS: Final = 4
_NO_CALLABLE = (UnknownModule, UnknownFunction, NotCallable, NotPublic, InvalidFunctionRef)


class _Interrupted(BaseException):
    """Raised in a running call's code by `Executor._on_interrupt`."""


INTERRUPT_SIGNAL: Final = signal.SIGUSR1
"""Sent by the executor's reader thread to its main thread to stop a cancelled call."""


class FunctionResolver(Protocol):
    """Turns `"module.function"` of a code epoch into the callable to run."""

    def resolve(self, epoch: str, function: str, /) -> Callable[..., object]:
        """Raises the errors of `blockx.functions` (UnknownModule, ...), or
        CodeUnavailable when the code could not be fetched."""
        ...

    def forget(self, epoch: str, /) -> None:
        """Drop what is cached for `epoch`."""
        ...


def _exit(code: int) -> NoReturn:
    # os._exit: no interpreter teardown, which could wait on a running call.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _complain(text: str) -> None:
    print(f"blockx executor {os.getpid()}: {text}", file=sys.stderr, flush=True)


def _describe(exc: BaseException) -> str:
    """`Type: message`, then the traceback of function code (newest frames kept)."""
    summary = f"{type(exc).__name__}: {exc}"
    # The first frame is the executor's own call site, which says nothing to users.
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    frames = "".join(traceback.format_tb(tb)) if tb is not None else ""
    room = _MAX_ERROR_MESSAGE_CHARS - len(summary) - 1
    if room <= 0:
        return summary[:_MAX_ERROR_MESSAGE_CHARS]
    if len(frames) > room:
        frames = "..." + frames[len(frames) - room + 3 :]
    return f"{summary}\n{frames}".rstrip("\n")


class _Connection:
    """The socket to the worker: whole frames written under one lock, raw reads."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._write_lock = threading.Lock()
        self.decoder = FrameDecoder()

    def send(self, *messages: Message) -> None:
        data = encode_frames(messages)
        with self._write_lock:
            self._send_locked(data)

    def send_made(self, make: Callable[[], Message]) -> None:
        """Send the message `make` returns, made while the write lock is held: what it
        reads cannot change before the frame is out, so no frame written after the reading
        goes before it. (The write lock is taken first, the executor's lock inside it;
        nothing holds the executor's lock while it writes.)"""
        with self._write_lock:
            self._send_locked(encode_frames((make(),)))

    def _send_locked(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError:
            _exit(EXIT_CONNECTION_LOST)

    def receive_some(self, *, before_welcome: bool = False) -> bytes:
        """The next bytes from the worker; never empty (end of file exits)."""
        try:
            data = self._sock.recv(RECV_BYTES)
        except OSError:
            _exit(EXIT_CONNECTION_LOST)
        if not data:
            if before_welcome:
                _complain("the worker closed the connection before Welcome (rejected)")
                _exit(EXIT_REJECTED)
            _exit(EXIT_CONNECTION_LOST)
        return data

    def receive_first(self) -> Message:
        """The first message (the handshake runs before any other thread starts)."""
        while True:
            for message in self.decoder:
                return message
            self.decoder.feed(self.receive_some(before_welcome=True))


_Queued = tuple[CallRequest, float | None]  # the request, its deadline on our monotonic clock
_Attempt = tuple[str, int]  # (call id, attempt)


class Executor:
    """The executor runtime: call queue, results outbox, subcalls, code fetches.

    All fields below `_cond` are guarded by it. The main thread is the only one
    that runs calls, pushes and pops `_running` and fills the outbox.
    """

    def __init__(
        self,
        *,
        executor_id: str,
        connection: _Connection,
        welcome: Welcome,
        resolver: FunctionResolver | None = None,
    ) -> None:
        self._executor_id = executor_id
        self._connection = connection
        self._heartbeat_interval_s = welcome.heartbeat_interval_ms / 1000
        self._max_result_bytes = welcome.max_result_bytes
        self._resolver: FunctionResolver = resolver or EpochModules(fetch=self._fetch_code)
        self._epochs: collections.OrderedDict[str, None] = collections.OrderedDict()
        # (epoch, "module.function") -> callable: resolved once, not per call.
        self._resolved: dict[tuple[str, str], Callable[..., object]] = {}
        self._ids = itertools.count(1)
        self._calls_served = 0  # written by the main thread only
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[_Queued] = collections.deque()
        # (call id, attempt) of the running calls; the innermost (nested) call is last.
        self._running: list[_Attempt] = []
        self._cancelled: set[_Attempt] = set()  # running attempts the worker cancelled
        # The attempt whose function code the main thread runs right now (None in the
        # executor's own code and while a call waits on a subcall): written by the main
        # thread only. `_interrupt` is the attempt the worker cancelled while it ran.
        self._interruptible: _Attempt | None = None
        self._interrupt: _Attempt | None = None
        self._main_thread = threading.get_ident()  # `serve` runs on the main thread
        self._pending_subcalls: set[str] = set()
        self._subcall_results: dict[str, SubcallResult] = {}
        self._pending_code: set[str] = set()
        self._code_replies: dict[str, CodeReply] = {}
        self._outbox: list[CallOutcome | Succeeded] = []
        self._outbox_bytes = 0
        self._outbox_since = 0.0
        self._shutdown = False
        self._idle = True  # the main thread waits for the worker: that is progress too
        self._progress_at = time.monotonic()

    # --- threads ----------------------------------------------------------------

    def serve(self) -> NoReturn:
        """Run on the main thread until Shutdown or end of file."""
        bind_subcall_port(self)
        signal.signal(INTERRUPT_SIGNAL, self._on_interrupt)
        for target, name in ((self._read_loop, "reader"), (self._tick_loop, "ticker")):
            threading.Thread(target=self._guarded, args=(target,), name=name, daemon=True).start()
        while True:
            item = self._next_work(None, None)
            assert not isinstance(item, SubcallResult)  # only asked for while waiting
            self._run(*item)

    def _guarded(self, loop: Callable[[], None]) -> None:
        # A helper thread that dies would leave the executor deaf or silent.
        try:
            loop()
        except BaseException:
            traceback.print_exc()
            _exit(EXIT_INTERNAL_ERROR)

    def _read_loop(self) -> None:
        decoder = self._connection.decoder
        while True:
            try:
                for message in decoder:
                    self._on_message(message)
            except WireError as exc:
                _complain(f"the worker sent a bad frame: {exc}")
                _exit(EXIT_PROTOCOL_ERROR)
            decoder.feed(self._connection.receive_some())

    def _tick_loop(self) -> None:
        tick_s = min(self._heartbeat_interval_s, _RESULT_FLUSH_AFTER_S)
        next_beat = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_beat:
                self._send_heartbeat(now)
                next_beat = now + self._heartbeat_interval_s
            with self._cond:
                stale = bool(self._outbox) and now - self._outbox_since >= _RESULT_FLUSH_AFTER_S
            if stale:
                self._flush()
            time.sleep(tick_s)

    # --- inbound (reader thread) --------------------------------------------------

    def _on_message(self, message: Message) -> None:
        cond = self._cond
        match message:
            case RunCalls(calls=calls):
                now = time.monotonic()
                queued = [
                    (
                        c,
                        None
                        if c.deadline_ms_from_now is None
                        else now + c.deadline_ms_from_now / 1000,
                    )
                    for c in calls
                ]
                with cond:
                    self._queue.extend(queued)
                    cond.notify()
            case SubcallResult(outcome=CallOutcome(call_id=subcall_id)):
                with cond:
                    if subcall_id in self._pending_subcalls:  # else: its caller gave up
                        self._pending_subcalls.discard(subcall_id)
                        self._subcall_results[subcall_id] = message
                        cond.notify()
            case CodeReply(request_id=request_id):
                with cond:
                    if request_id in self._pending_code:
                        self._pending_code.discard(request_id)
                        self._code_replies[request_id] = message
                        cond.notify()
            case CancelCall(call_id=call_id, attempt=attempt):
                self._cancel((call_id, attempt))
            case RevokeCall(call_id=call_id, attempt=attempt):
                self._revoke((call_id, attempt))
            case Shutdown():
                with cond:
                    self._shutdown = True
                    cond.notify()
            case _:
                _complain(f"the worker sent {type(message).__name__}, which it never may here")
                _exit(EXIT_PROTOCOL_ERROR)

    def _revoke(self, attempt: _Attempt) -> None:
        """Give a queued attempt back to the worker; one that started runs on."""
        with self._cond:
            if not self._drop_queued(attempt):
                return
        self._unstarted(attempt, FailureCode.CALL_REVOKED, "taken back before it started")

    def _unstarted(self, attempt: _Attempt, code: FailureCode, message: str) -> None:
        """Report that `attempt` left the queue without running (retryable when revoked)."""
        outcome = CallOutcome.failure(
            call_id=attempt[0],
            attempt=attempt[1],
            error_code=code,
            error_message=message,
            retryable=code is FailureCode.CALL_REVOKED,
        )
        self._connection.send(CallResults(results=(outcome,)))

    def _drop_queued(self, attempt: _Attempt) -> bool:
        """Remove `attempt` from the queue (the lock held); False if it is not queued."""
        for index, (request, _deadline) in enumerate(self._queue):
            if (request.call_id, request.attempt) == attempt:
                del self._queue[index]
                return True
        return False

    def _cancel(self, attempt: _Attempt) -> None:
        with self._cond:
            if not self._drop_queued(attempt):
                if attempt in self._running and attempt not in self._cancelled:
                    self._cancelled.add(attempt)  # seen when it next waits on a subcall
                    self._cond.notify()
                    # And interrupted now, if its own code runs (`_on_interrupt`).
                    self._interrupt = attempt
                    signal.pthread_kill(self._main_thread, INTERRUPT_SIGNAL)
                return  # running, finished or unknown: its own result will tell
        self._unstarted(
            attempt, FailureCode.CALL_CANCELLED, "cancelled by the worker before it started"
        )

    def _on_interrupt(self, signum: int, frame: object) -> None:
        """The signal handler (main thread): stop the running call the worker cancelled.

        Python runs it between two bytecodes of the main thread, or when a blocking
        system call there (a sleep, a socket read) is interrupted, so a call spinning
        in Python or waiting in a system call stops at once. It raises only inside
        that call's own code (`_interruptible`), and once per cancel. Code that holds
        the interpreter in C for long does not stop: the worker replaces the executor
        after its cancel grace.
        """
        target = self._interrupt
        if target is not None and target == self._interruptible:
            self._interrupt = None
            raise _Interrupted

    @contextlib.contextmanager
    def _not_interruptible(self) -> Iterator[None]:
        """While the running call waits in the executor's own code (a subcall, a code
        fetch): no interrupt lands there; the call's own code is interruptible after."""
        outer, self._interruptible = self._interruptible, None
        try:
            yield
        finally:
            self._interruptible = outer

    # --- the main loop ------------------------------------------------------------

    def _next_work(
        self, subcall_id: str | None, caller: _Attempt | None
    ) -> _Queued | SubcallResult:
        """The next call to run, or (when `subcall_id` is given) that subcall's result
        as soon as it arrives. Sends finished results before it sleeps."""
        cond = self._cond
        while True:
            with cond:
                while True:
                    if subcall_id is not None:
                        result = self._subcall_results.pop(subcall_id, None)
                        if result is not None:
                            self._progress_at = time.monotonic()
                            return result
                        if caller in self._cancelled:
                            assert caller is not None
                            self._pending_subcalls.discard(subcall_id)
                            raise CallCancelled(call_id=caller[0])
                    if self._shutdown:
                        if subcall_id is None:
                            break  # nothing is running any more: time to go
                        # else a running call waits: let it finish, start nothing new
                    elif self._queue:
                        queued = self._queue.popleft()
                        self._running.append((queued[0].call_id, queued[0].attempt))
                        self._progress_at = time.monotonic()
                        return queued
                    if self._outbox:
                        break  # send them, then look again
                    self._idle = True
                    cond.wait()
                    self._progress_at = time.monotonic()
                    self._idle = False
            self._flush()
            if self._shutdown and subcall_id is None:
                _exit(EXIT_SHUTDOWN)

    def _run(self, request: CallRequest, deadline_at: float | None) -> None:
        result = self._execute(request, deadline_at)
        self._calls_served += 1
        size = len(result[2]) if isinstance(result, tuple) else len(result.error_message)
        with self._cond:
            self._running.pop()
            self._cancelled.discard((request.call_id, request.attempt))
            if not self._outbox:
                self._outbox_since = time.monotonic()
            self._outbox.append(result)
            self._outbox_bytes += size
            full = len(self._outbox) >= _MAX_BATCH_RESULTS or self._outbox_bytes >= _MAX_BATCH_BYTES
        if full:
            self._flush()

    def _flush(self) -> None:
        with self._cond:
            results, self._outbox, self._outbox_bytes = self._outbox, [], 0
        if results:
            succeeded = tuple(r for r in results if isinstance(r, tuple))
            failed = tuple(r for r in results if not isinstance(r, tuple))
            self._connection.send(CallResults(results=failed, succeeded=succeeded))

    def _execute(self, request: CallRequest, deadline_at: float | None) -> CallOutcome | Succeeded:
        """How the attempt ended: a failure's outcome, or a success as it travels."""

        def failed(code: FailureCode, message: str, *, retryable: bool = False) -> CallOutcome:
            return CallOutcome.failure(
                call_id=request.call_id,
                attempt=request.attempt,
                error_code=code,
                error_message=message,
                retryable=retryable,
            )

        if deadline_at is not None and time.monotonic() >= deadline_at:
            return failed(
                FailureCode.DEADLINE_EXCEEDED,
                "the deadline passed while the call was queued; it never started",
                retryable=True,
            )
        try:
            function = self._resolve(request.epoch, request.function)
        except _NO_CALLABLE as exc:
            return failed(FailureCode.UNKNOWN_FUNCTION, str(exc))
        except CodeUnavailable as exc:
            return failed(FailureCode.CODE_UNAVAILABLE, str(exc), retryable=True)
        except FunctionCodeError as exc:  # the module does not compile or its import raised
            return failed(FailureCode.CALL_RAISED, str(exc))
        try:
            args, kwargs = decode_args(request.args)
        except InvalidArguments as exc:
            return failed(FailureCode.INVALID_ARGS, str(exc))
        attempt = (request.call_id, request.attempt)
        try:
            try:
                self._interruptible = attempt
                value = function(*args, **kwargs)
            finally:
                self._interruptible = None
        except _Interrupted:
            self._interruptible = None  # the handler may have run before the finally did
            return failed(FailureCode.CALL_CANCELLED, "cancelled by the worker while it ran")
        except RetryableError as exc:
            return failed(FailureCode.CALL_RAISED_RETRYABLE, _describe(exc), retryable=True)
        except SubcallFailed as exc:
            code = FailureCode.CALL_RAISED_RETRYABLE if exc.retryable else FailureCode.CALL_RAISED
            return failed(code, _describe(exc), retryable=exc.retryable)
        except CallCancelled as exc:
            return failed(FailureCode.CALL_CANCELLED, str(exc))
        except BaseException as exc:  # function code may raise anything, SystemExit included
            return failed(FailureCode.CALL_RAISED, _describe(exc))
        try:
            packed = encode_value(value)
        except (TypeError, ValueError, OverflowError) as exc:
            why = f"the {type(value).__name__} returned has no msgpack form: {exc}"
            return failed(FailureCode.RESULT_NOT_SERIALIZABLE, why)
        if len(packed) > self._max_result_bytes:
            return failed(
                FailureCode.RESULT_TOO_LARGE,
                f"the result takes {len(packed)} bytes; the limit is {self._max_result_bytes}",
            )
        return (request.call_id, request.attempt, packed)

    def _resolve(self, epoch: str, function: str) -> Callable[..., object]:
        epochs = self._epochs
        if epoch not in epochs:
            epochs[epoch] = None
            if len(epochs) > _KEPT_EPOCHS:
                oldest, _ = epochs.popitem(last=False)
                self._resolver.forget(oldest)
                self._resolved = {k: v for k, v in self._resolved.items() if k[0] != oldest}
        elif next(reversed(epochs)) != epoch:
            epochs.move_to_end(epoch)
        key = (epoch, function)
        resolved = self._resolved.get(key)
        if resolved is None:
            resolved = self._resolved[key] = self._resolver.resolve(epoch, function)
        return resolved

    # --- round trips to the worker (main thread) ----------------------------------------

    def subcall(self, function: str, args: tuple[object, ...], kwargs: dict[str, object]) -> Any:
        """`blockx.subcall`: runs other calls of this executor until the result is in."""
        caller = self._running[-1]
        try:
            payload = encode_args(args, kwargs)
        except (TypeError, ValueError, OverflowError) as exc:
            raise SubcallFailed(
                function=function,
                error_code=FailureCode.INVALID_ARGS,
                error_message=f"the arguments have no msgpack form: {exc}",
                retryable=False,
            ) from exc
        subcall_id = f"{self._executor_id}.s{next(self._ids)}"
        with self._not_interruptible():  # the wait is the executor's own code
            return self._await_subcall(subcall_id, caller, function, payload)

    def _await_subcall(
        self, subcall_id: str, caller: _Attempt, function: str, payload: bytes
    ) -> Any:
        with self._cond:
            self._pending_subcalls.add(subcall_id)
        self._connection.send(
            Subcall(
                subcall_id=subcall_id,
                parent_call_id=caller[0],
                parent_attempt=caller[1],
                function=function,
                args=payload,
            )
        )
        while True:
            item = self._next_work(subcall_id, caller)
            if isinstance(item, SubcallResult):
                break
            self._run(*item)
        outcome = item.outcome
        if outcome.error_code is None:
            return decode_value(outcome.value)
        raise SubcallFailed(
            function=function,
            error_code=outcome.error_code,
            error_message=outcome.error_message,
            retryable=outcome.retryable,
        )

    def _fetch_code(self, epoch: str, module: str) -> str:
        """The `fetch` of the loader: a CodeRequest round trip (not interrupted: a call
        importing a module mid-run stops when its own code runs again)."""
        with self._not_interruptible():
            return self._request_code(epoch, module)

    def _request_code(self, epoch: str, module: str) -> str:
        request_id = f"{self._executor_id}.c{next(self._ids)}"
        with self._cond:
            self._pending_code.add(request_id)
        self._flush()  # results already finished should not wait for the code
        self._connection.send(CodeRequest(request_id=request_id, epoch=epoch, module=module))
        with self._cond:
            self._idle = True
            while request_id not in self._code_replies:
                self._cond.wait()
            self._idle = False
            self._progress_at = time.monotonic()
            reply = self._code_replies.pop(request_id)
        if reply.source is not None:
            return reply.source
        if reply.error is None:
            raise UnknownModule(epoch=epoch, module=module)
        raise CodeUnavailable(module=module, epoch=epoch, reason=reply.error)

    def _send_heartbeat(self, now: float) -> None:
        rss = rss_bytes()

        def beat() -> Heartbeat:
            with self._cond:
                running = self._running[-1][0] if self._running else None
                age_s = 0.0 if self._idle else now - self._progress_at
            return Heartbeat(
                running_call_id=running,
                loop_progress_age_ms=max(0, int(age_s * 1000)),
                rss_bytes=rss,
                calls_served=self._calls_served,
            )

        # Made under the write lock: a call that ends meanwhile sends its results after
        # this beat, so the worker never gets a beat naming a call it has had the answer
        # of (it takes the running call off when the answer comes).
        self._connection.send_made(beat)


def _ignore_signal(signum: int, frame: object) -> None:
    """Signals from outside do not stop an executor; see `main`."""


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(
        prog="python -m blockx.executors.child",
        description=f"A blockx executor process. The token comes from ${TOKEN_ENV}.",
    )
    parser.add_argument("--socket", required=True, help="the worker's Unix socket")
    parser.add_argument("--executor-id", required=True, help="the id the worker gave this process")
    options = parser.parse_args(argv)
    # Popped, so that processes started by function code do not inherit it.
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        _complain(f"{TOKEN_ENV} is not set; executors are started by the worker")
        _exit(EXIT_USAGE)
    tune_gc()
    # Ctrl-C in a terminal, and a process manager signalling the whole group, reach
    # executors too; the worker owns their lifetime (they exit when its socket closes).
    # A handler that does nothing, not SIG_IGN: processes that function code starts
    # get the default dispositions back when they exec.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _ignore_signal)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(options.socket)
    except OSError as exc:
        _complain(f"cannot connect to {options.socket}: {exc}")
        _exit(EXIT_CONNECTION_LOST)
    connection = _Connection(sock)
    connection.send(
        Hello(
            executor_id=options.executor_id,
            pid=os.getpid(),
            token=token,
            protocol_version=PROTOCOL_VERSION,
        )
    )
    try:
        welcome = connection.receive_first()
    except WireError as exc:
        _complain(f"the worker sent a bad frame: {exc}")
        _exit(EXIT_PROTOCOL_ERROR)
    if not isinstance(welcome, Welcome):
        _complain(f"the worker sent {type(welcome).__name__} instead of Welcome")
        _exit(EXIT_PROTOCOL_ERROR)
    Executor(executor_id=options.executor_id, connection=connection, welcome=welcome).serve()


if __name__ == "__main__":
    main()
