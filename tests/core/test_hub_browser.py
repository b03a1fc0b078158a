"""The dashboard's sign-in sessions (`blockx.hub._browser`) and the sign-in form's reading
(`blockx.hub._ui`), with explicit times: their life, the cap, the cookie, the CSRF rule."""

from __future__ import annotations

from blockx.hub._browser import (
    MAX_SESSIONS,
    SESSION_LIFE_MS,
    BrowserSessions,
    Refusal,
    cookie,
    session_cookie,
)
from blockx.hub._ui import credential_field
from blockx.net.http import Request

NOW_MS = 1_800_000_000_000


def request(method: bytes = b"GET", **headers: str) -> Request:
    return Request(
        method=method,
        target=b"/v1/queues",
        headers=[
            (name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()
        ],
        keep_alive=True,
        upgrade=False,
    )


def test_a_session_lives_twelve_hours() -> None:
    sessions = BrowserSessions()
    session = sessions.open("bxc_a.secret", NOW_MS)
    assert SESSION_LIFE_MS == 12 * 3_600_000
    assert sessions.find(session.session_id, NOW_MS + SESSION_LIFE_MS - 1) == session
    assert sessions.find(session.session_id, NOW_MS + SESSION_LIFE_MS) is None
    assert len(sessions) == 0  # forgotten once found ended


def test_ids_and_csrf_tokens_are_random_and_long() -> None:
    sessions = BrowserSessions()
    opened = [sessions.open("bxc_a.secret", NOW_MS) for _ in range(50)]
    secrets = {s.session_id for s in opened} | {s.csrf_token for s in opened}
    assert len(secrets) == 100
    assert min(len(secret) for secret in secrets) >= 43  # 32 random bytes


def test_the_oldest_session_goes_first_when_the_most_are_open() -> None:
    sessions = BrowserSessions(most=3)
    first, second, third = (sessions.open(f"t{n}", NOW_MS + n) for n in range(3))
    fourth = sessions.open("t3", NOW_MS + 3)
    assert sessions.find(first.session_id, NOW_MS + 4) is None
    assert [sessions.find(s.session_id, NOW_MS + 4) for s in (second, third, fourth)] == [
        second,
        third,
        fourth,
    ]
    assert MAX_SESSIONS == 1_000


def test_ended_sessions_go_when_a_new_one_opens() -> None:
    sessions = BrowserSessions(most=10)
    for n in range(5):
        sessions.open(f"t{n}", NOW_MS + n)
    sessions.open("late", NOW_MS + SESSION_LIFE_MS + 2)  # the first three have ended
    assert len(sessions) == 3


def test_sign_out_closes_only_that_session() -> None:
    sessions = BrowserSessions()
    one, two = sessions.open("t1", NOW_MS), sessions.open("t2", NOW_MS)
    sessions.close(one.session_id)
    sessions.close("unknown")
    assert sessions.find(one.session_id, NOW_MS) is None
    assert sessions.find(two.session_id, NOW_MS) == two


def test_the_caller_is_the_bearer_token_else_the_cookies_session() -> None:
    sessions = BrowserSessions()
    session = sessions.open("bxc_session.secret", NOW_MS)
    named = f"other=1; blockx_hub_session={session.session_id}; more=2"
    assert sessions.caller(request(authorization="Bearer bxc_b.s", cookie=named), NOW_MS) == (
        "bxc_b.s"
    )
    assert sessions.caller(request(authorization="", cookie=named), NOW_MS) == ""
    assert sessions.caller(request(cookie=named), NOW_MS) == session.token
    assert sessions.caller(request(method=b"HEAD", cookie=named), NOW_MS) == session.token
    assert sessions.caller(request(cookie="blockx_hub_session=forged"), NOW_MS) == ""
    assert sessions.caller(request(), NOW_MS) == ""
    assert sessions.caller(request(cookie=named), NOW_MS + SESSION_LIFE_MS) == ""


def test_a_change_through_the_cookie_needs_the_csrf_token() -> None:
    sessions = BrowserSessions()
    session = sessions.open("bxc_session.secret", NOW_MS)
    named = f"blockx_hub_session={session.session_id}"
    refused = Refusal(403, "missing or wrong CSRF token")
    for method in (b"POST", b"PUT", b"DELETE", b"PATCH"):
        assert sessions.caller(request(method, cookie=named), NOW_MS) == refused
        wrong = request(method, cookie=named, x_csrf_token=session.csrf_token[:-1] + "!")
        assert sessions.caller(wrong, NOW_MS) == refused
        non_ascii = request(method, cookie=named, x_csrf_token="é")
        assert sessions.caller(non_ascii, NOW_MS) == refused
        right = request(method, cookie=named, x_csrf_token=session.csrf_token)
        assert sessions.caller(right, NOW_MS) == session.token
    # A bearer token needs none: a browser never sends one by itself.
    assert sessions.caller(request(b"POST", authorization="Bearer t"), NOW_MS) == "t"


def test_the_cookie_is_http_only_strict_and_secure_under_tls() -> None:
    assert session_cookie("abc", secure=False) == (
        "blockx_hub_session=abc; Path=/; HttpOnly; SameSite=Strict"
    )
    assert session_cookie("abc", secure=True) == (
        "blockx_hub_session=abc; Path=/; HttpOnly; SameSite=Strict; Secure"
    )
    assert session_cookie("", secure=True) == (
        "blockx_hub_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0; Secure"
    )


def test_a_cookie_is_found_by_its_exact_name() -> None:
    assert cookie(request(cookie='a=1; b="2"'), "b") == "2"
    assert cookie(request(cookie="ab=1"), "a") == ""
    assert cookie(request(cookie="a"), "a") == ""
    assert cookie(request(), "a") == ""


def test_the_sign_in_form_holds_one_credential() -> None:
    assert credential_field(b"credential=bxc_a.b%2Bc") == "bxc_a.b+c"
    assert credential_field(b"submit=Sign+in&credential=+bxc_a.b+") == "bxc_a.b"
    assert credential_field(b"credential=") == ""
    for bad in (b"", b"password=x", b"credential=a&credential=b", "é".encode(), b"credential=%ff"):
        assert credential_field(bad) is None, bad
    assert credential_field(b"&".join([b"x=1"] * 16) + b"&credential=a") is None
