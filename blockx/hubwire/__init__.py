"""The hub's wire protocol: what an automatic worker and the hub say to each other.

A leaf package: message classes, the codec, limits, paths and the JSON rules.
It imports only attrs, cattrs, msgpack and `blockx.errors`, so the automatic
worker (a client) and the hub (its server) share it without either importing
the other.

Payloads, results and failure details are JSON texts, kept as their producer
wrote them from end to end; `parse_json` holds the rules every one of them
keeps, and `dumps` writes values with stored texts (`RawJson`) spliced in.

Workers speak over a WebSocket at `WORKER_PATH`; producers use HTTP JSON under
`API_PREFIX` (`queue_tasks_path`, `task_path`).

Every WebSocket message is one binary frame holding a msgpack array of
messages; each message is a map whose `type` names it. A frame may carry
several messages (a worker may pipeline its control requests; the hub
answers in frames of whatever is ready), so nothing depends on how messages
are grouped. One attrs class per message and one cattrs converter for all.

The first message on a connection is `Hello` (protocol version, credential);
the hub answers `Welcome` or `Error` and closes. Then `OpenSession` names the
worker's instance, queue, capabilities and capacity; the hub answers with
the session TTL and starts sending `Offer`s of matching work, never more at
once than the capacity the worker last declared (`Heartbeat` renews the
session and declares the capacity). The worker runs an offered attempt only
after its `Start` is granted, `Renew`s the lease while it runs, and ends it
with `Finish` (SUCCEEDED with a JSON result, FAILED with a code, details and
whether a retry is safe, or UNKNOWN with a code). After a reconnect, `Resume`
names the attempts it still holds; `Drain` asks for no more offers.

Every control message (OpenSession, Start, Renew, Finish, Resume, Drain)
carries a `message_id` unique within the worker's instance; the hub answers
a repeated id with the answer it gave the first time (a receipt), so a
resend after a lost answer is harmless. A malformed frame is answered with
`Error` and the connection is closed.
"""

from blockx.hubwire._codec import (
    CONVERTER,
    TAGS,
    TYPE_KEY,
    ProtocolError,
    check,
    decode,
    encode,
    encode_message,
    frame,
)
from blockx.hubwire._json import (
    MAX_NESTING,
    MIN_INT,
    InvalidJson,
    JsonTooLarge,
    RawJson,
    array_items,
    compact,
    dumps,
    object_members,
    parse_json,
)
from blockx.hubwire._messages import (
    API_PREFIX,
    CODE_FORM,
    MAX_BATCH_BYTES,
    MAX_BATCH_TASKS,
    MAX_CAPACITY,
    MAX_FRAME_BYTES,
    MAX_FRAME_MESSAGES,
    MAX_ID_CHARS,
    MAX_INT,
    MAX_JSON_BYTES,
    NODE_TASK_HANDLER,
    PROTOCOL_VERSION,
    WORKER_PATH,
    Answer,
    AttemptRef,
    AttemptStatus,
    Capability,
    ControlMessage,
    Disposition,
    Drain,
    DrainAck,
    Error,
    ErrorCode,
    Failed,
    Finish,
    Granted,
    Heartbeat,
    HeartbeatAck,
    Hello,
    Message,
    Offer,
    OpenSession,
    Outcome,
    Recorded,
    RefusalCode,
    Refused,
    Renew,
    Resume,
    Resumed,
    ResumedAttempt,
    SessionOpened,
    Start,
    Succeeded,
    ToHub,
    ToWorker,
    Unknown,
    Welcome,
    node_task_capability,
    queue_batch_path,
    queue_tasks_path,
    task_path,
)

__all__ = [
    "API_PREFIX",
    "CODE_FORM",
    "CONVERTER",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_TASKS",
    "MAX_CAPACITY",
    "MAX_FRAME_BYTES",
    "MAX_FRAME_MESSAGES",
    "MAX_ID_CHARS",
    "MAX_INT",
    "MAX_JSON_BYTES",
    "MAX_NESTING",
    "MIN_INT",
    "NODE_TASK_HANDLER",
    "PROTOCOL_VERSION",
    "TAGS",
    "TYPE_KEY",
    "WORKER_PATH",
    "Answer",
    "AttemptRef",
    "AttemptStatus",
    "Capability",
    "ControlMessage",
    "Disposition",
    "Drain",
    "DrainAck",
    "Error",
    "ErrorCode",
    "Failed",
    "Finish",
    "Granted",
    "Heartbeat",
    "HeartbeatAck",
    "Hello",
    "InvalidJson",
    "JsonTooLarge",
    "Message",
    "Offer",
    "OpenSession",
    "Outcome",
    "ProtocolError",
    "RawJson",
    "Recorded",
    "RefusalCode",
    "Refused",
    "Renew",
    "Resume",
    "Resumed",
    "ResumedAttempt",
    "SessionOpened",
    "Start",
    "Succeeded",
    "ToHub",
    "ToWorker",
    "Unknown",
    "Welcome",
    "array_items",
    "check",
    "compact",
    "decode",
    "dumps",
    "encode",
    "encode_message",
    "frame",
    "node_task_capability",
    "object_members",
    "parse_json",
    "queue_batch_path",
    "queue_tasks_path",
    "task_path",
]
