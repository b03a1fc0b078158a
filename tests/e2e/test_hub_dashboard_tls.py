"""The dashboard on a real hub process serving HTTPS: signing in gives a `Secure` cookie, the
pages and shared files come from the installed package, the API answers the cookie, and an
event stream ticks until the hub is told to stop.

Wall-clock time: the hub is another process. Each wait is for a condition, under a
`fail_after`.
"""

from __future__ import annotations

import signal
from pathlib import Path

import trio

from blockx.hub import Right, Store, create_credential
from tests.adapters.certificates import make_pki
from tests.adapters.test_hub_dashboard import post_sign_in, sign_in
from tests.adapters.test_hub_live import events
from tests.e2e.hub_process import hub_process

FAIL_AFTER_S = 30


async def test_over_https_a_signed_in_browser_reads_live_until_the_hub_stops(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "hub.sqlite3")
    store = Store(db)
    try:
        token = create_credential(store, "*", frozenset({Right.ADMIN}), 0)
    finally:
        store.close()
    with trio.fail_after(FAIL_AFTER_S):
        async with hub_process(db, {"LOG_FORMAT": "text"}, tls=make_pki(tmp_path)) as hub:
            first = await post_sign_in(hub, token)
            signed = await sign_in(hub, token)
            script = await hub.exchange("GET", "/ui/hub.js")
            charts = await hub.exchange("GET", "/assets/charts.js")
            stats = await hub.exchange("GET", "/v1/stats", headers=signed.headers())
            async with events(hub, signed.headers()) as stream:
                tick = await stream.tick()
                assert hub.process is not None
                hub.process.send_signal(signal.SIGTERM)
                while await stream.tick() is not None:
                    pass
            await hub.process.wait()
    assert first.header("set-cookie").endswith("; Path=/; HttpOnly; SameSite=Strict; Secure")
    assert (script.status, charts.status) == (200, 200)
    assert stats.status == 200
    assert stats.json()["step_ms"] == 10_000
    assert tick is not None
    assert tick["queues"] == []
    assert stream.ended
    assert hub.process.returncode == 0
