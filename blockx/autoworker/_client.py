"""Where the hub is and who this program is to it: its URL and a credential.

`HubClient` opens the connections an automatic worker runs over and makes the
producers' HTTP requests (submit a task, read one, wait for its end) that the
command line, examples, benches and tests need: each on a connection of its
own, or, with `keep_alive`, on connections the hub keeps open between
requests. `submit_task` queues a worker node's task (a task file's object) for
the nodes that take tasks from the hub. A test may subclass it to
reach a hub some other way (in memory, or through a proxy that injects
faults) by overriding `open_stream`.

Over TLS (`https://`, `wss://`) it always verifies the hub's certificate and
name: against the CAs of `ca_file` when given, else the system's. Its TLS files
are read when it is made, so a missing one fails at once, naming the field.
"""

from __future__ import annotations

import decimal
import json
import ssl
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import h11
import trio

from blockx.errors import BlockxError, InvalidValue
from blockx.hubwire import (
    MAX_BATCH_BYTES,
    MAX_BATCH_TASKS,
    Capability,
    RawJson,
    dumps,
    node_task_capability,
    queue_batch_path,
    queue_tasks_path,
    task_path,
)

_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
REUSE_IDLE_S = 5.0
"""A kept connection idle longer than this is not used again: the hub closes its kept
connections after 10 s idle, and a request must not cross that close."""
MAX_WAIT_MS: Final = 30_000
"""The longest the hub holds a reader of a task that has not ended (`task`'s `wait_ms`)."""
ENDED_STATES: Final = frozenset({"SUCCEEDED", "FAILED", "NEEDS_REVIEW", "CANCELLED"})
"""The hub's task states that end `wait_task`: its terminal ones (`blockx.hub.TaskState`,
which this package does not import)."""


class HubCertificateRejected(BlockxError, trio.BrokenResourceError):
    """The hub's certificate did not verify against the CAs this client trusts (or does not
    name the host dialled): the cause is the `ssl.SSLCertVerificationError`. A connection
    that broke (`trio.BrokenResourceError`), and one that trying again will not mend."""

    def __init__(self, *, url: str, trusted: str, reason: str) -> None:
        self.url = url
        self.trusted = trusted
        self.reason = reason
        super().__init__(
            f"the hub's certificate at {url} did not verify against {trusted}: {reason}"
        )


class HubRequestFailed(BlockxError):
    """The hub answered a producer request with an error status; `body` is its JSON
    answer (the text itself when it is not JSON: a peer that is not a hub)."""

    def __init__(self, *, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        super().__init__(f"the hub answered {status}: {body}")


def _parse(url: str) -> tuple[str, int, bool]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    InvalidValue.check(
        scheme in _DEFAULT_PORTS and bool(parts.hostname),
        field="url",
        value=url,
        allowed="the hub's address, e.g. http://127.0.0.1:8090 (http, https, ws or wss)",
    )
    assert parts.hostname is not None
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError as error:
        raise InvalidValue(field="url", value=url, allowed=f"a valid port ({error})") from None
    return parts.hostname, port, scheme in ("https", "wss")


@attrs.frozen(kw_only=True)
class HubClient:
    """The hub at `url`, reached with `credential` (a `bxc_...` token).

    The credential is sent in each connection's hello and each producer request's
    `Authorization` header; it is never logged or shown (`repr` leaves it out).
    """

    url: str
    credential: str = attrs.field(repr=False)
    ssl_context: ssl.SSLContext | None = attrs.field(default=None, repr=False)
    """For https/wss, full control: the context to connect with, instead of the one made
    from `ca_file`, `cert_file` and `key_file`."""
    ca_file: str = ""
    """For https/wss: a PEM file of the CA certificates that sign the hub's certificate (a
    private CA), trusted instead of the system's CAs; "" trusts the system's."""
    cert_file: str = ""
    """For https/wss: a PEM certificate (chain) to present to a hub that asks clients for
    one (mutual TLS), with `key_file`; both or neither."""
    key_file: str = ""
    """The unencrypted PEM private key of `cert_file`."""
    keep_alive: bool = False
    """Producer requests reuse the connections the hub keeps open (HTTP/1.1 keep-alive),
    until `aclose`; else each request has a connection of its own."""
    _idle: list[tuple[float, trio.abc.Stream, h11.Connection]] = attrs.field(
        factory=list, init=False, repr=False, eq=False
    )
    host: str = attrs.field(init=False)
    port: int = attrs.field(init=False)
    tls: bool = attrs.field(init=False)
    _context: ssl.SSLContext | None = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        host, port, tls = _parse(self.url)
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)
        object.__setattr__(self, "tls", tls)
        object.__setattr__(self, "_context", self._tls_context())

    def _tls_context(self) -> ssl.SSLContext | None:
        """The context to connect with, None for plain text. The TLS fields are for https
        and wss only, and `ssl_context` comes alone (it decides what is trusted)."""
        given = [
            (field, value)
            for field, value in (
                ("ssl_context", self.ssl_context),
                ("ca_file", self.ca_file),
                ("cert_file", self.cert_file),
                ("key_file", self.key_file),
            )
            if value
        ]
        for field, value in given:
            InvalidValue.check(
                self.tls, field=field, value=value, allowed="only for an https or wss url"
            )
        for field, value in given[1:]:
            InvalidValue.check(
                self.ssl_context is None, field=field, value=value, allowed="not with ssl_context"
            )
        if not self.tls or self.ssl_context is not None:
            return self.ssl_context
        # Only a TLS client loads the TLS module (and what it imports).
        from blockx.net.tls import HTTP1_ALPN, client_context  # noqa: PLC0415

        return client_context(
            (self.ca_file, "ca_file"),
            (self.cert_file, "cert_file"),
            (self.key_file, "key_file"),
            alpn=HTTP1_ALPN,
        )

    async def open_stream(self) -> trio.abc.Stream:
        """A fresh byte stream to the hub; over TLS, once its handshake is done:
        `HubCertificateRejected` if the hub's certificate did not verify."""
        if self._context is None:
            return await trio.open_tcp_stream(self.host, self.port)
        stream = await trio.open_ssl_over_tcp_stream(
            self.host, self.port, ssl_context=self._context, https_compatible=True
        )
        try:
            await stream.do_handshake()
        except BaseException as error:
            await trio.aclose_forcefully(stream)
            cause = error.__cause__
            if isinstance(cause, ssl.SSLCertVerificationError):
                raise HubCertificateRejected(
                    url=self.url, trusted=self._trusted(), reason=cause.verify_message
                ) from cause
            raise
        return stream

    def _trusted(self) -> str:
        if self.ssl_context is not None:
            return "the CAs of the ssl_context given"
        return f"the CAs of ca_file {self.ca_file}" if self.ca_file else "the system's CAs"

    # ------------------------------------------------------------------ producers' API

    async def submit(
        self, queue_id: str, capability: Capability, payload: Any, **fields: Any
    ) -> dict[str, Any]:
        """Queue a task (`fields`: idempotency, max_attempts, task_id, priority, delay_ms,
        run_at_ms, concurrency_key, ...); the task.

        `payload` is any JSON value (`decimal.Decimal`s written exactly), or a `RawJson`
        whose text is the payload exactly as the handler will get it."""
        document = task_submission(capability, payload, **fields)
        task: dict[str, Any] = await self.request("POST", queue_tasks_path(queue_id), document)
        return task

    async def submit_many(
        self, queue_id: str, documents: Iterable[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """Queue many tasks, each a submission as `task_submission` makes it, in batches of at
        most `MAX_BATCH_TASKS` tasks and `MAX_BATCH_BYTES` (one transaction each). One
        answer per task, in order: `status` (201 queued, 200 a repeat of its task id, 4xx
        refused) with its `task_id`, or with `error` and the `field` at fault."""
        answers: list[dict[str, Any]] = []
        for batch in _batches(documents):
            text = await self.request_text("POST", queue_batch_path(queue_id), batch)
            offset = len(answers)
            for answer in json.loads(text)["results"]:
                answer["index"] += offset
                answers.append(answer)
        return answers

    async def task(
        self, task_id: str, *, wait_ms: int = 0, decimals: bool = False
    ) -> dict[str, Any]:
        """A task as the hub has it now, with its attempts and history; with `wait_ms`
        (at most 30,000), as soon as it has ended, or once that much time has passed.
        With `decimals`, numbers with a fraction or an exponent are `decimal.Decimal`s."""
        query = f"?wait_ms={wait_ms}" if wait_ms else ""
        task: dict[str, Any] = await self.request(
            "GET", task_path(task_id) + query, decimals=decimals
        )
        return task

    async def wait_task(self, task_id: str, *, decimals: bool = False) -> dict[str, Any]:
        """Task `task_id` once it has ended (`ENDED_STATES`), asking again each time the
        hub's longest wait passes. NEEDS_REVIEW counts as an end here, though the hub
        keeps such a task: its attempt may have had its effect, so nothing runs it again
        until an operator retries or resolves it, however long that takes."""
        while True:
            task = await self.task(task_id, wait_ms=MAX_WAIT_MS, decimals=decimals)
            if task["state"] in ENDED_STATES:
                return task

    async def submit_task(
        self, queue_id: str, task: Mapping[str, Any], *, deployment: str = "block", **fields: Any
    ) -> dict[str, Any]:
        """Queue a worker node's task (`node_task_submission`): `task` is the object of a
        task file, checked before anything is sent; the task as the hub has it."""
        document = node_task_submission(task, deployment=deployment, **fields)
        queued: dict[str, Any] = await self.request("POST", queue_tasks_path(queue_id), document)
        return queued

    async def submit_tasks(
        self,
        queue_id: str,
        tasks: Iterable[Mapping[str, Any]],
        *,
        deployment: str = "block",
        **fields: Any,
    ) -> list[dict[str, Any]]:
        """Queue many worker nodes' tasks as `submit_task` does one, through `submit_many`
        (its batches, its answers). Every task is checked before any is sent: a bad one
        raises `InvalidTaskSpec` naming its index and key (`[3].builder`). Each task's
        own task_id names it: `fields` give none."""
        from blockx.client import InvalidTaskSpec  # noqa: PLC0415

        InvalidValue.check(
            "task_id" not in fields,
            field="task_id",
            value=fields.get("task_id"),
            allowed="not for many tasks: each task's own task_id names it",
        )
        documents = []
        for index, task in enumerate(tasks):
            try:
                documents.append(node_task_submission(task, deployment=deployment, **fields))
            except InvalidTaskSpec as error:
                raise InvalidTaskSpec(
                    field=f"[{index}].{error.field}", value=error.value, allowed=error.allowed
                ) from None
        return await self.submit_many(queue_id, documents)

    async def request(
        self, method: str, target: str, body: Any = None, *, decimals: bool = False
    ) -> Any:
        """One producer request; its JSON answer (with `decimals`, numbers with a fraction
        or an exponent as `decimal.Decimal`s), or `HubRequestFailed`."""
        text = await self.request_text(method, target, body)
        parse_float = decimal.Decimal if decimals else float
        return json.loads(text, parse_float=parse_float) if text else None

    async def request_text(self, method: str, target: str, body: Any = None) -> str:
        """One producer request; its JSON answer's text exactly as the hub sent it (a
        task's payload and result as their producers wrote them), or `HubRequestFailed`.
        `body` is written by `blockx.hubwire.dumps`: `RawJson` and Decimals exactly."""
        data = b"" if body is None else dumps(body).encode()
        headers = [
            ("host", f"{self.host}:{self.port}"),
            ("authorization", f"Bearer {self.credential}"),
            ("content-type", "application/json"),
            ("content-length", str(len(data))),
            *(() if self.keep_alive else (("connection", "close"),)),
        ]
        stream, connection = await self._connection()
        status, content = 0, bytearray()
        try:
            await stream.send_all(
                connection.send(h11.Request(method=method, target=target, headers=headers))
                + connection.send(h11.Data(data=data))
                + connection.send(h11.EndOfMessage())
            )
            while not isinstance(event := connection.next_event(), h11.EndOfMessage):
                if event is h11.NEED_DATA:
                    if not (data := bytes(await stream.receive_some())):
                        raise trio.BrokenResourceError(self._closed_early())
                    connection.receive_data(data)
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    content += event.data
                    if len(content) > MAX_RESPONSE_BYTES:
                        raise HubRequestFailed(status=status, body="answer too large")
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        if self.keep_alive and connection.our_state is connection.their_state is h11.DONE:
            connection.start_next_cycle()
            self._idle.append((trio.current_time(), stream, connection))
        else:
            await stream.aclose()
        text = content.decode()
        if status >= 300:
            raise HubRequestFailed(status=status, body=_json_or_text(text))
        return text

    def _closed_early(self) -> str:
        hint = (
            " (a hub that asks for client certificates does so when it accepts none:"
            " see cert_file and key_file)"
            if self.tls and not self.cert_file
            else ""
        )
        return f"the hub closed the connection before answering{hint}"

    async def _connection(self) -> tuple[trio.abc.Stream, h11.Connection]:
        while self._idle:
            used_at, stream, connection = self._idle.pop()
            if trio.current_time() - used_at < REUSE_IDLE_S:
                return stream, connection
            await stream.aclose()
        return await self.open_stream(), h11.Connection(h11.CLIENT)

    async def aclose(self) -> None:
        """Close the connections kept for later requests."""
        while self._idle:
            await self._idle.pop()[1].aclose()


def hub_client_of(
    url: str, credential_file: str, *, ca_file: str = "", keep_alive: bool = False
) -> HubClient:
    """The client of the hub at `url`, with the credential `credential_file` holds (a
    command's, a node's). `InvalidValue` whose field is "url", "credential_file" or
    "ca_file" says what is wrong, for the caller to name its own flag or setting."""
    try:
        credential = Path(credential_file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidValue(
            field="credential_file", value=credential_file, allowed=f"a readable file ({error})"
        ) from None
    InvalidValue.check(
        bool(credential),
        field="credential_file",
        value=credential_file,
        allowed="a file holding a credential; it is empty",
    )
    # The URL's error, or the CA file's (not for an http URL: unread), name their field.
    return HubClient(url=url, credential=credential, ca_file=ca_file, keep_alive=keep_alive)


def task_submission(capability: Capability, payload: Any, **fields: Any) -> dict[str, Any]:
    """A task as the producers' API takes it: its capability, its payload (any JSON value,
    or a `RawJson` text) and optional `fields` (idempotency, max_attempts, task_id, ...)."""
    return {
        "handler": capability.handler,
        "handler_version": capability.handler_version,
        "payload_version": capability.payload_version,
        "payload": payload,
        **fields,
    }


def node_task_submission(
    task: Mapping[str, Any], *, deployment: str = "block", **fields: Any
) -> dict[str, Any]:
    """A worker node's task as the producers' API takes it: `task` is the object of a task
    file (`examples/tasks/*.json`), carried as the payload of the capability of the nodes
    of `deployment` (`node_task_capability`: "block" or "bundle", the node's profile), so
    only such nodes take it. `fields` as `task_submission`'s.

    The task is checked as a node will read it (`blockx.client.task_spec_from_json`): a
    bad one raises `InvalidTaskSpec` naming its key. Its task_id, if it has one, is the
    hub's task id, so submitting the same task again is a repeat (answered 200), not a
    second task; a `task_id` in `fields` wins, and is written into the payload too, for
    the node to run the task under the id the hub knows it by."""
    # The worker's task format and its profiles come with the worker's client: loaded
    # here only, so an automatic worker never loads them.
    from blockx.client import task_spec_from_json  # noqa: PLC0415
    from blockx.profiles import PROFILES  # noqa: PLC0415

    InvalidValue.check(
        deployment in PROFILES,
        field="deployment",
        value=deployment,
        allowed=f"a worker node's profile: {', '.join(PROFILES)}",
    )
    named = fields.get("task_id")
    own = task.get("task_id") if isinstance(task, Mapping) else None
    # A task that names itself nowhere is named by the hub: checked under a stand-in id.
    task_spec_from_json(task, task_id=named if named is not None or own is not None else "-")
    payload = dict(task)
    if named is not None:
        payload["task_id"] = named
    elif own is not None:
        fields["task_id"] = own
    return task_submission(node_task_capability(deployment), payload, **fields)


def _batches(documents: Iterable[Mapping[str, Any]]) -> Iterator[RawJson]:
    """The documents as JSON arrays of at most `MAX_BATCH_TASKS` items and (but for a lone
    item, which the hub judges) `MAX_BATCH_BYTES`."""
    texts: list[str] = []
    size = 2
    for document in documents:
        text = dumps(document)
        if texts and (
            len(texts) == MAX_BATCH_TASKS or size + len(text.encode()) + 1 > MAX_BATCH_BYTES
        ):
            yield RawJson("[" + ",".join(texts) + "]")
            texts, size = [], 2
        texts.append(text)
        size += len(text.encode()) + 1
    if texts:
        yield RawJson("[" + ",".join(texts) + "]")


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text
