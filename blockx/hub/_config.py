"""The hub's settings, each with its default and its environment variable, declared once.

`HubConfig.load(env, overrides)`: built-in defaults, then the environment,
then explicit values (command-line flags); a bad value is an `InvalidValue`
naming the flag or the variable it came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from blockx.config import parse_listen_addr
from blockx.errors import InvalidValue
from blockx.hub._rules import Timing

_ENV_KEY: Final = "blockx.hub.env"


def _setting(default: Any, env: str) -> Any:
    return attrs.field(default=default, metadata={_ENV_KEY: env})


@attrs.frozen(kw_only=True)
class HubConfig:
    listen_addr: str = _setting(":8090", "HUB_LISTEN")
    """host:port of the worker WebSocket (/v1/worker) and the producer API (/v1/...)."""
    db: str = _setting("hub.sqlite3", "HUB_DB")
    """A SQLite file path, or a postgresql:// URL (several hubs may share one database)."""
    lease_ms: int = _setting(30_000, "HUB_LEASE_MS")
    """How long a start or a renewal lets an attempt run."""
    offer_ttl_ms: int = _setting(10_000, "HUB_OFFER_TTL_MS")
    """How long an offered attempt waits for its start."""
    session_ttl_ms: int = _setting(15_000, "HUB_SESSION_TTL_MS")
    """A worker connection that says nothing for this long is closed."""
    retry_backoff_ms: int = _setting(1_000, "HUB_RETRY_BACKOFF_MS")
    """The wait before a retry, doubling with each attempt."""
    max_retry_backoff_ms: int = _setting(60_000, "HUB_MAX_RETRY_BACKOFF_MS")
    poll_ms: int = _setting(200, "HUB_POLL_MS")
    """How often sessions with room look for work other hubs or commands queued."""
    receipt_retention_ms: int = _setting(86_400_000, "HUB_RECEIPT_RETENTION_MS")
    """How long an answer is kept for a resent message id."""

    def __attrs_post_init__(self) -> None:
        for field in attrs.fields(HubConfig):
            value = getattr(self, field.name)
            if isinstance(value, int):
                InvalidValue.check(
                    value > 0,
                    field=field.metadata[_ENV_KEY],
                    value=value,
                    allowed="must be > 0",
                )
        try:
            parse_listen_addr(self.listen_addr)
        except ValueError as error:
            raise InvalidValue(
                field="HUB_LISTEN", value=self.listen_addr, allowed=str(error)
            ) from None
        InvalidValue.check(
            self.max_retry_backoff_ms >= self.retry_backoff_ms,
            field="HUB_MAX_RETRY_BACKOFF_MS",
            value=self.max_retry_backoff_ms,
            allowed=f"must be >= HUB_RETRY_BACKOFF_MS ({self.retry_backoff_ms})",
        )

    def listen_host_port(self) -> tuple[str, int]:
        return parse_listen_addr(self.listen_addr)

    @property
    def timing(self) -> Timing:
        return Timing(
            lease_ms=self.lease_ms,
            offer_ttl_ms=self.offer_ttl_ms,
            retry_backoff_ms=self.retry_backoff_ms,
            max_retry_backoff_ms=self.max_retry_backoff_ms,
        )

    @classmethod
    def load(
        cls, env: Mapping[str, str], overrides: Mapping[str, object] | None = None
    ) -> HubConfig:
        """Defaults, then `env`, then `overrides` (attribute name -> value; None = not given)."""
        values: dict[str, object] = {}
        for field in attrs.fields(cls):
            text = env.get(field.metadata[_ENV_KEY], "")
            if text:
                values[field.name] = _parse(field, text)
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]  # each value was parsed for its field


def _parse(field: attrs.Attribute[Any], text: str) -> object:
    if not isinstance(field.default, int):
        return text
    try:
        return int(text)
    except ValueError:
        raise InvalidValue(
            field=field.metadata[_ENV_KEY], value=text, allowed="must be an integer"
        ) from None
