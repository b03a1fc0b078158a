"""The hub's dashboard: its pages under `/ui`, signing in and out, and the shared `/assets/`.

    GET  /ui, /ui/          303 to /ui/overview (signed in) or /ui/sign-in
    GET  /ui/sign-in        the sign-in page (`{{message}}` in it: why a sign-in failed)
    POST /ui/sign-in        a form with `credential`, an admin token: a session (`_browser`),
                            its cookie, and 303 to /ui/overview; 401 for anything else
    POST /ui/sign-out       the session ends (its CSRF token needed): 303 to /ui/sign-in
    GET  /ui/<page>         a page, signed in only (else 303 to /ui/sign-in), with the
                            session's CSRF token for `{{csrf_token}}`
    GET  /ui/<name>.js|css  the pages' scripts and styles, to anyone
    GET  /assets/...        what every blockx page shares (`blockx.web`), to anyone

The files are those of the package folder `ui/` whose names match `FILE_NAME`,
read once at import: a request's path never reaches the file system. What
every page shares (its head's links, the header with the navigation) is
written once, in `_head.html` and `_header.html`, and put in each page then. Every
answer carries `SECURITY_HEADERS` (no inline script may run, no other site may
frame a page). The pages read and act through the admin API (`/v1/...`) with
the session's cookie, and its CSRF token for what changes anything.
"""

from __future__ import annotations

import html
import importlib.resources
import re
import urllib.parse
from collections.abc import Callable
from typing import Final

import attrs
import trio

from blockx.hub._api import unreachable
from blockx.hub._auth import is_admin
from blockx.hub._browser import (
    SAFE_METHODS,
    WRONG_CSRF,
    BrowserSession,
    BrowserSessions,
    csrf_matches,
    session_cookie,
)
from blockx.hub._committer import Committer
from blockx.hub._store import StoreError
from blockx.hubwire import dumps
from blockx.net.http import BadRequest, Connection, Request, header, read_body, respond_keeping
from blockx.web import ASSETS_PATH, CACHE_CONTROL, asset, content_type

UI_PATH: Final = "/ui"
SIGN_IN_PATH: Final = "/ui/sign-in"
SIGN_OUT_PATH: Final = "/ui/sign-out"
HOME_PATH: Final = "/ui/overview"
MAX_SIGN_IN_BYTES: Final = 4 * 1024
FILE_NAME: Final = re.compile(r"[a-z][a-z-]*\.(html|js|css)")
PART_NAME: Final = re.compile(r"_[a-z]+\.html")
"""What the pages share, put in each as it is read (never served alone)."""
NOT_ADMIN: Final = "that is not an admin credential of this hub"
FORM_TYPE: Final = "application/x-www-form-urlencoded"
CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = (
    ("content-security-policy", CSP),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "same-origin"),
    ("x-content-type-options", "nosniff"),
)
_HTML: Final = "text/html; charset=utf-8"
_JSON: Final = "application/json"


def _files(pattern: re.Pattern[str]) -> dict[str, bytes]:
    folder = importlib.resources.files(__package__ or "blockx.hub").joinpath("ui")
    return {
        item.name: item.read_bytes()
        for item in folder.iterdir()
        if item.is_file() and pattern.fullmatch(item.name)
    }


def _page(text: str, parts: dict[str, bytes]) -> str:
    """A page with the parts every page shares (`_head.html` for `{{head}}`,
    `_header.html` for `{{header}}`) in place."""
    for name, part in parts.items():
        text = text.replace(
            "{{" + name.removeprefix("_").removesuffix(".html") + "}}", part.decode()
        )
    return text


_FILES: Final = _files(FILE_NAME)
_PARTS: Final = _files(PART_NAME)
PAGES: Final = {
    name.removesuffix(".html"): _page(body.decode(), _PARTS)
    for name, body in _FILES.items()
    if name.endswith(".html") and name != "sign-in.html"
}
"""Every page but the sign-in one, by the path under `/ui/` it is served at."""
SCRIPTS: Final = {name: body for name, body in _FILES.items() if not name.endswith(".html")}
_SIGN_IN_PAGE: Final = _FILES.get("sign-in.html", b"{{message}}").decode()


@attrs.frozen
class _Answer:
    status: int
    body: bytes | str = ""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


def _see_other(location: str, *headers: tuple[str, str]) -> _Answer:
    return _Answer(303, headers=(("location", location), *headers))


def _error(status: int, message: str) -> _Answer:
    return _Answer(status, dumps({"error": message}) + "\n", _JSON)


def _sign_in_page(status: int, message: str) -> _Answer:
    return _Answer(status, _SIGN_IN_PAGE.replace("{{message}}", html.escape(message)), _HTML)


class Dashboard:
    """Answers the requests for `/ui` and `/assets/` of one hub."""

    def __init__(
        self,
        committer: Committer,
        sessions: BrowserSessions,
        *,
        now_ms: Callable[[], int],
        secure: bool,
    ) -> None:
        self._committer = committer
        self._sessions = sessions
        self._now_ms = now_ms
        self._secure = secure
        """The hub serves TLS: the cookie is `Secure`, the hub's origin `https://`."""

    @staticmethod
    def serves(path: str) -> bool:
        return path in (UI_PATH, f"{UI_PATH}/") or path.startswith((f"{UI_PATH}/", ASSETS_PATH))

    async def serve(
        self,
        stream: trio.abc.Stream,
        connection: Connection,
        request: Request,
        path: str,
    ) -> bool:
        """Answer `request` for `path` (one `serves`); whether the connection is kept."""
        answer = await self._answer(stream, connection, request, path)
        return await respond_keeping(
            stream,
            connection,
            request,
            answer.status,
            answer.body,
            content_type=answer.content_type,
            extra=[*SECURITY_HEADERS, *answer.headers],
        )

    async def _answer(
        self, stream: trio.abc.Stream, connection: Connection, request: Request, path: str
    ) -> _Answer:
        method = request.method
        if path == SIGN_IN_PATH and method == b"POST":
            return await self._sign_in(stream, connection, request)
        if path == SIGN_OUT_PATH:
            return self._sign_out(request) if method == b"POST" else _not_allowed("POST")
        if method not in SAFE_METHODS:
            return _not_allowed("GET, HEAD, POST" if path == SIGN_IN_PATH else "GET, HEAD")
        session = self._sessions.of(request, self._now_ms())
        name = path.removeprefix(f"{UI_PATH}/")
        if path.startswith(ASSETS_PATH):
            found = asset(path)
            if found is None:
                return _error(404, f"no such file: {path}")
            return _Answer(200, found[0], found[1], (("cache-control", CACHE_CONTROL),))
        if path in (UI_PATH, f"{UI_PATH}/"):
            return _see_other(SIGN_IN_PATH if session is None else HOME_PATH)
        if path == SIGN_IN_PATH:
            return _sign_in_page(200, "")
        if name in SCRIPTS:
            return _Answer(200, SCRIPTS[name], content_type(name), (("cache-control", "no-cache"),))
        if name in PAGES:
            if session is None:
                return _see_other(SIGN_IN_PATH)
            page = PAGES[name].replace("{{csrf_token}}", html.escape(session.csrf_token))
            return _Answer(200, page, _HTML)
        return _error(404, f"no such page: {path}")

    async def _sign_in(
        self, stream: trio.abc.Stream, connection: Connection, request: Request
    ) -> _Answer:
        """A session for the admin credential the form names; the sign-in page saying what
        was wrong otherwise (the same words for any credential that is not an admin's)."""
        origin = header(request, b"origin")
        if origin and origin.lower() != self._origin(request):
            return _sign_in_page(403, "a sign-in from another site's page is refused")
        form = header(request, b"content-type").partition(";")[0].strip().lower()
        if form != FORM_TYPE:
            return _sign_in_page(400, f"a sign-in is a form ({FORM_TYPE}), not {form or 'nothing'}")
        try:
            body = await read_body(stream, connection, request, MAX_SIGN_IN_BYTES)
        except BadRequest as error:
            return _sign_in_page(error.status, f"the sign-in form is refused: {error}")
        token = credential_field(body)
        if token is None:
            return _sign_in_page(
                400, "the sign-in form must hold one field credential, URL-encoded"
            )
        try:
            admin = await self._committer.do(lambda tx: is_admin(tx, token))
        except StoreError as error:
            return _sign_in_page(503, unreachable(error))
        if not admin:
            return _sign_in_page(401, NOT_ADMIN)
        session = self._sessions.open(token, self._now_ms())
        return _see_other(HOME_PATH, ("set-cookie", self._cookie(session)))

    def _sign_out(self, request: Request) -> _Answer:
        session = self._sessions.of(request, self._now_ms())
        if session is None:
            return _error(401, "not signed in")
        if not csrf_matches(request, session):
            return _error(403, WRONG_CSRF)
        self._sessions.close(session.session_id)
        return _see_other(SIGN_IN_PATH, ("set-cookie", self._cookie(None)))

    def _cookie(self, session: BrowserSession | None) -> str:
        return session_cookie("" if session is None else session.session_id, secure=self._secure)

    def _origin(self, request: Request) -> str:
        """This hub's origin, as the browser that reached it names it."""
        scheme = "https" if self._secure else "http"
        return f"{scheme}://{header(request, b'host').strip().lower()}"


def credential_field(body: bytes) -> str | None:
    """The one `credential` of a URL-encoded form, if it is one and holds one."""
    try:
        fields = urllib.parse.parse_qs(
            body.decode("ascii"), keep_blank_values=True, max_num_fields=16, errors="strict"
        )
    except ValueError:  # not ASCII, not UTF-8 once decoded, or too many fields
        return None
    values = fields.get("credential", [])
    return values[0].strip() if len(values) == 1 else None


def _not_allowed(allowed: str) -> _Answer:
    answer = _error(405, f"use {allowed}")
    return attrs.evolve(answer, headers=(("allow", allowed),))
