"""The dashboard's sign-in sessions: kept in memory, named by a cookie, guarded by a CSRF token.

Signing in with an admin credential (`_ui`) opens a `BrowserSession`: a
random id, the credential's token, and a random CSRF token. The browser holds
only the id, in the cookie `SESSION_COOKIE` (`HttpOnly`, `SameSite=Strict`,
`Secure` under TLS). A request without an `Authorization` header is
authenticated by its cookie: the session's token stands in for a bearer token
and is checked in the request's transaction as every token is, so revoking the
credential signs its sessions out at their next request. A request so
authenticated whose method changes something (not GET or HEAD) must carry the
session's CSRF token in `X-CSRF-Token` (`caller`).

Sessions end after `SESSION_LIFE_MS`, at sign-out, or when the hub stops; at
most `MAX_SESSIONS` are kept, the oldest going first.
"""

from __future__ import annotations

import secrets
from typing import Final

import attrs

from blockx.net.http import Request, header

SESSION_COOKIE: Final = "blockx_hub_session"
SESSION_LIFE_MS: Final = 12 * 3_600_000
MAX_SESSIONS: Final = 1_000
CSRF_HEADER: Final = b"x-csrf-token"
SAFE_METHODS: Final = frozenset({b"GET", b"HEAD"})
WRONG_CSRF: Final = "missing or wrong CSRF token"


@attrs.frozen(kw_only=True)
class BrowserSession:
    session_id: str
    token: str
    """The credential signed in with: checked again at every request."""
    csrf_token: str
    opened_at_ms: int


@attrs.frozen
class Refusal:
    """Why a request is refused before its credential is even looked at."""

    status: int
    error: str


class BrowserSessions:
    """The sessions of one hub process, oldest first."""

    def __init__(self, *, life_ms: int = SESSION_LIFE_MS, most: int = MAX_SESSIONS) -> None:
        self._life_ms = life_ms
        self._most = most
        self._sessions: dict[str, BrowserSession] = {}
        """By id, in the order they were opened (so the oldest is the first)."""

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, token: str, now_ms: int) -> BrowserSession:
        """A new session for `token`; the oldest goes if `most` are open, and any that
        ended meanwhile."""
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if len(self._sessions) < self._most and not self._ended(oldest, now_ms):
                break
            del self._sessions[oldest.session_id]
        session = BrowserSession(
            session_id=secrets.token_urlsafe(32),
            token=token,
            csrf_token=secrets.token_urlsafe(32),
            opened_at_ms=now_ms,
        )
        self._sessions[session.session_id] = session
        return session

    def find(self, session_id: str, now_ms: int) -> BrowserSession | None:
        """The live session `session_id` names, if any."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if self._ended(session, now_ms):
            del self._sessions[session_id]
            return None
        return session

    def close(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def of(self, request: Request, now_ms: int) -> BrowserSession | None:
        """The live session the request's cookie names, if any."""
        return self.find(cookie(request, SESSION_COOKIE), now_ms)

    def caller(self, request: Request, now_ms: int) -> str | Refusal:
        """The token a request to the API is made with: its bearer token if it has an
        `Authorization` header, else its session's ("" for none: refused as unknown);
        a `Refusal` if the session's CSRF token is due and missing or wrong."""
        if any(name == b"authorization" for name, _ in request.headers):
            return header(request, b"authorization").removeprefix("Bearer ").strip()
        session = self.of(request, now_ms)
        if session is None:
            return ""
        if request.method not in SAFE_METHODS and not csrf_matches(request, session):
            return Refusal(403, WRONG_CSRF)
        return session.token

    def _ended(self, session: BrowserSession, now_ms: int) -> bool:
        return now_ms - session.opened_at_ms >= self._life_ms


def csrf_matches(request: Request, session: BrowserSession) -> bool:
    sent = header(request, CSRF_HEADER).encode()
    return secrets.compare_digest(sent, session.csrf_token.encode())


def cookie(request: Request, name: str) -> str:
    """The value of cookie `name` the request carries ("" if none)."""
    for pair in header(request, b"cookie").replace(",", ";").split(";"):
        key, equals, value = pair.strip().partition("=")
        if equals and key == name:
            return value.strip().strip('"')
    return ""


def session_cookie(session_id: str, *, secure: bool) -> str:
    """The `Set-Cookie` value that gives the browser its session (or, for "", ends it)."""
    attributes = "Path=/; HttpOnly; SameSite=Strict"
    if not session_id:
        attributes += "; Max-Age=0"
    if secure:
        attributes += "; Secure"
    return f"{SESSION_COOKIE}={session_id}; {attributes}"
