"""The hub's dashboard over plain HTTP on an in-process hub: signing in and out, the session
cookie, CSRF on what changes anything, the pages and their security headers, and bad input.

The page files are the pages side's; these tests rely only on `{{csrf_token}}` in
`overview.html`, `{{message}}` in `sign-in.html` and the form field `credential`.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import attrs
import trio
import trio.testing

from blockx.hub import Right
from blockx.hub._ui import CSP, MAX_SIGN_IN_BYTES, NOT_ADMIN, PAGES, SCRIPTS
from tests.adapters.autoworker_rig import SQLITE
from tests.adapters.certificates import make_pki
from tests.adapters.hub_harness import QUEUE, TEST_CONFIG, HubEndpoint, HubRig, Reply, running_hub
from tests.adapters.test_hub_admin import credential_id

FORM = ("content-type", "application/x-www-form-urlencoded")
COOKIE_FORM = re.compile(
    r"blockx_hub_session=([A-Za-z0-9_-]{43}); Path=/; HttpOnly; SameSite=Strict"
)
WRONG_CSRF = {"error": "missing or wrong CSRF token"}


@attrs.frozen
class Signed:
    """A browser signed in: its cookie and the CSRF token its pages carry."""

    cookie: str
    csrf_token: str

    def headers(self, *, csrf: str | None = None) -> list[tuple[str, str]]:
        headers = [("cookie", self.cookie)]
        return headers if csrf is None else [*headers, ("x-csrf-token", csrf)]


def form(**fields: str) -> bytes:
    return urllib.parse.urlencode(fields).encode()


async def post_sign_in(hub: HubEndpoint, token: str, *headers: tuple[str, str]) -> Reply:
    return await hub.exchange(
        "POST", "/ui/sign-in", headers=[FORM, *headers], data=form(credential=token)
    )


async def sign_in(hub: HubEndpoint, token: str) -> Signed:
    reply = await post_sign_in(hub, token)
    assert (reply.status, reply.header("location")) == (303, "/ui/overview"), reply.text
    cookie = reply.header("set-cookie").partition(";")[0]
    page = await hub.exchange("GET", "/ui/overview", headers=[("cookie", cookie)])
    assert page.status == 200, page.text
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.text)
    assert found is not None, page.text
    return Signed(cookie=cookie, csrf_token=found[1])


def admin(rig: HubRig) -> str:
    return rig.credential("*", Right.ADMIN)


@SQLITE
async def test_a_signed_out_browser_is_sent_to_sign_in_and_the_api_refuses_it(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        pages = {page: await rig.exchange("GET", f"/ui/{page}") for page in PAGES}
        home = [await rig.exchange("GET", path) for path in ("/ui", "/ui/")]
        sign_out = await rig.exchange("POST", "/ui/sign-out")
        stale = await rig.exchange(
            "GET", "/ui/overview", headers=[("cookie", "blockx_hub_session=forged")]
        )
        api = {
            path: await rig.exchange("GET", path)
            for path in ("/v1/queues", "/v1/workers", "/v1/stats", "/v1/events")
        }
        paused = await rig.exchange("POST", f"/v1/queues/{QUEUE}:pause")
        sign_in_page = await rig.exchange("GET", "/ui/sign-in")
        script = await rig.exchange("GET", "/ui/hub.js")
        shared = await rig.exchange("GET", "/assets/base.css")
    assert {"overview"} <= set(pages)
    for reply in [*pages.values(), *home, stale]:
        assert (reply.status, reply.header("location")) == (303, "/ui/sign-in")
        assert not reply.header("set-cookie")
    assert sign_out.status == 401
    for reply in [*api.values(), paused]:
        assert reply.status == 401, reply.text
        assert "no valid credential" in reply.json()["error"]
    assert sign_in_page.status == 200
    assert 'name="credential"' in sign_in_page.text
    assert "{{message}}" not in sign_in_page.text
    assert (script.status, script.header("cache-control")) == (200, "no-cache")
    assert script.header("content-type").startswith("text/javascript")
    assert "hub.js" in SCRIPTS
    assert (shared.status, shared.header("content-type")) == (200, "text/css; charset=utf-8")


@SQLITE
async def test_signing_in_gives_a_strict_http_only_cookie_and_the_pages_their_csrf_token(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = admin(rig)
        reply = await post_sign_in(rig, token)
        signed = await sign_in(rig, token)
        home = await rig.exchange("GET", "/ui", headers=signed.headers())
        queues = await rig.exchange("GET", "/v1/queues", headers=signed.headers())
        unauthenticated_page = await rig.exchange("GET", "/ui/overview")
        pages = [
            await rig.exchange("GET", f"/ui/{page}", headers=signed.headers()) for page in PAGES
        ]
    cookie = reply.header("set-cookie")
    assert COOKIE_FORM.fullmatch(cookie), cookie
    assert "Secure" not in cookie  # plain HTTP
    assert signed.cookie != cookie.partition(";")[0]  # each sign-in a session of its own
    assert len(signed.csrf_token) >= 32
    assert (home.status, home.header("location")) == (303, "/ui/overview")
    assert queues.status == 200
    assert [q["queue_id"] for q in queues.json()["queues"]] == [QUEUE]
    assert unauthenticated_page.status == 303
    for page in pages:  # each with the parts all share, and the session's token in them
        assert page.status == 200
        assert "{{" not in page.text
        assert '<nav aria-label="Dashboard">' in page.text
        assert f'<meta name="csrf-token" content="{signed.csrf_token}">' in page.text


@SQLITE
async def test_a_change_through_the_cookie_needs_the_sessions_csrf_token(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = admin(rig)
        signed, other = await sign_in(rig, token), await sign_in(rig, token)
        pause = f"/v1/queues/{QUEUE}:pause"
        missing = await rig.exchange("POST", pause, headers=signed.headers())
        wrong = await rig.exchange("POST", pause, headers=signed.headers(csrf="x" * 43))
        anothers = await rig.exchange("POST", pause, headers=signed.headers(csrf=other.csrf_token))
        still = await rig.exchange("GET", "/v1/queues", headers=signed.headers())
        paused = await rig.exchange("POST", pause, headers=signed.headers(csrf=signed.csrf_token))
        by_bearer = await rig.http("POST", f"/v1/queues/{QUEUE}:resume", token=token)
    for reply in (missing, wrong, anothers):
        assert (reply.status, reply.json()) == (403, WRONG_CSRF)
    assert still.json()["queues"][0]["paused"] is False  # nothing was done
    assert paused.status == 200
    assert paused.json()["paused"] is True
    assert by_bearer[0] == 200  # a bearer token needs no CSRF token


@SQLITE
async def test_every_credential_but_an_admins_is_refused_alike(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        revoked = admin(rig)
        await rig.http("POST", f"/v1/credentials/{credential_id(revoked)}:revoke", token=admin(rig))
        wrong = {
            "unknown": "bxc_0123456789abcdef.secret",
            "malformed": "hello",
            "empty": "",
            "producer": rig.credential(QUEUE, Right.PRODUCER, Right.WORKER),
            "revoked": revoked,
            "wrong secret": admin(rig) + "x",
        }
        replies = {name: await post_sign_in(rig, token) for name, token in wrong.items()}
    for name, reply in replies.items():
        assert reply.status == 401, name
        assert NOT_ADMIN in reply.text, name
        assert not reply.header("set-cookie"), name
    assert len({reply.text for reply in replies.values()}) == 1  # nothing tells them apart


async def test_a_revoked_credentials_session_is_refused_at_its_next_request(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = admin(rig)
        signed = await sign_in(rig, token)
        before = await rig.exchange("GET", "/v1/stats", headers=signed.headers())
        revoke = f"/v1/credentials/{credential_id(token)}:revoke"
        revoked = await rig.exchange("POST", revoke, headers=signed.headers(csrf=signed.csrf_token))
        after = await rig.exchange("GET", "/v1/queues", headers=signed.headers())
        again = await post_sign_in(rig, token)
    assert before.status == 200
    assert (revoked.status, revoked.json()["revoked"]) == (200, True)
    assert after.status == 401
    assert again.status == 401


@SQLITE
async def test_signing_out_ends_the_session_and_expires_the_cookie(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        signed = await sign_in(rig, admin(rig))
        refused = await rig.exchange("POST", "/ui/sign-out", headers=signed.headers())
        wrong_method = await rig.exchange("GET", "/ui/sign-out", headers=signed.headers())
        out = await rig.exchange(
            "POST", "/ui/sign-out", headers=signed.headers(csrf=signed.csrf_token)
        )
        page = await rig.exchange("GET", "/ui/overview", headers=signed.headers())
        api = await rig.exchange("GET", "/v1/queues", headers=signed.headers())
        twice = await rig.exchange(
            "POST", "/ui/sign-out", headers=signed.headers(csrf=signed.csrf_token)
        )
    assert (refused.status, refused.json()) == (403, WRONG_CSRF)
    assert (wrong_method.status, wrong_method.header("allow")) == (405, "POST")
    assert (out.status, out.header("location")) == (303, "/ui/sign-in")
    assert out.header("set-cookie") == (
        "blockx_hub_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
    )
    assert (page.status, page.header("location")) == (303, "/ui/sign-in")
    assert api.status == 401
    assert twice.status == 401


@SQLITE
async def test_a_bad_sign_in_is_answered_with_what_is_wrong_and_the_hub_carries_on(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = admin(rig)
        sign_in_at = "/ui/sign-in"

        async def post(data: bytes, *headers: tuple[str, str]) -> Reply:
            return await rig.exchange("POST", sign_in_at, headers=headers, data=data)

        large = await post(form(credential=token, padding="x" * MAX_SIGN_IN_BYTES), FORM)
        json_body = await post(b'{"credential": "x"}', ("content-type", "application/json"))
        no_type = await post(form(credential=token))
        not_ascii = await post("credential=bxc_é".encode(), FORM)
        not_utf8 = await post(b"credential=%ff%fe", FORM)
        missing = await post(form(password=token), FORM)
        twice = await post(form(credential=token) + b"&" + form(credential=token), FORM)
        many = await post(b"&".join([b"a=1"] * 100) + b"&" + form(credential=token), FORM)
        foreign = await post_sign_in(rig, token, ("origin", "https://evil.test"))
        null = await post_sign_in(rig, token, ("origin", "null"))
        same_site = await post_sign_in(rig, token, ("origin", "http://hub.test"))
        still = await rig.http("GET", "/v1/queues", token=token)
    assert large.status == 413
    assert f"more than {MAX_SIGN_IN_BYTES} bytes" in large.text
    for reply in (json_body, no_type):
        assert reply.status == 400
        assert "application/x-www-form-urlencoded" in reply.text
    for reply in (not_ascii, not_utf8, missing, twice, many):
        assert reply.status == 400
        assert "one field credential" in reply.text
    for reply in (foreign, null):
        assert reply.status == 403
        assert "another site" in reply.text
        assert not reply.header("set-cookie")
    assert same_site.status == 303
    assert still[0] == 200


@SQLITE
async def test_every_dashboard_answer_carries_the_security_headers(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        signed = await sign_in(rig, admin(rig))
        html = {
            "sign-in": await rig.exchange("GET", "/ui/sign-in"),
            "refused sign-in": await post_sign_in(rig, "nope"),
            "overview": await rig.exchange("GET", "/ui/overview", headers=signed.headers()),
        }
        others = [
            await rig.exchange("GET", "/ui/hub.js"),
            await rig.exchange("GET", "/ui"),
            await rig.exchange("GET", "/ui/nothing-here"),
        ]
    for name, reply in html.items():
        assert reply.header("content-type") == "text/html; charset=utf-8", name
        assert reply.header("cache-control") == "no-store", name
    for reply in [*html.values(), *others]:
        assert reply.header("content-security-policy") == CSP
        assert reply.header("x-frame-options") == "DENY"
        assert reply.header("referrer-policy") == "same-origin"
    assert CSP == (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    )


@SQLITE
async def test_only_the_known_files_are_served(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        signed = await sign_in(rig, admin(rig))
        paths = (
            "/ui/nothing-here",
            "/ui/overview.html",
            "/ui/../_server.py",
            "/ui/%2e%2e/_server.py",
            "/ui/sign-in.html",
            "/ui/Hub.js",
            "/assets/../hub/_ui.py",
            "/assets/nothing.css",
        )
        missing = [await rig.exchange("GET", p, headers=signed.headers()) for p in paths]
        deleted = await rig.exchange(
            "DELETE", "/ui/overview", headers=signed.headers(csrf=signed.csrf_token)
        )
        head = await rig.exchange("HEAD", "/ui/hub.js")
    assert [reply.status for reply in missing] == [404] * len(paths)
    assert (deleted.status, deleted.header("allow")) == (405, "GET, HEAD")
    assert (head.status, bytes(head.content)) == (200, b"")
    assert int(head.header("content-length")) == len(SCRIPTS["hub.js"])


@SQLITE
async def test_under_tls_the_cookie_is_secure_and_the_origin_https(
    hub_url: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The settings say the hub serves TLS (the in-process hub's streams are plain: what is
    checked is what the dashboard makes of the settings)."""
    pki = make_pki(tmp_path / "pki")
    config = attrs.evolve(TEST_CONFIG, tls_cert_file=pki.cert_file, tls_key_file=pki.key_file)
    async with running_hub(hub_url, config) as rig:
        token = admin(rig)
        plain = await post_sign_in(rig, token, ("origin", "http://hub.test"))
        secure = await post_sign_in(rig, token, ("origin", "https://hub.test"))
        signed = await sign_in(rig, token)
        out = await rig.exchange(
            "POST", "/ui/sign-out", headers=signed.headers(csrf=signed.csrf_token)
        )
    assert plain.status == 403
    assert secure.status == 303
    assert secure.header("set-cookie").endswith("; Path=/; HttpOnly; SameSite=Strict; Secure")
    assert out.header("set-cookie").endswith("; Max-Age=0; Secure")
