"""What the dashboard reads live, on an in-process hub on Trio's virtual clock: this hub's
worker sessions (`/v1/workers`), its series of the last hour (`/v1/stats`), and the stream of
ticks (`/v1/events`): one read a second for every stream, none without, 32 streams at most,
a slow client dropped, a revoked credential's stream ended, every stream ended by a drain."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h11
import trio
import trio.testing

from blockx.autoworker import WorkerExecution
from blockx.hub import Right
from blockx.hub._live import MAX_STREAMS, STREAM_BUFFER
from blockx.hubwire import Succeeded
from tests.adapters.autoworker_rig import SQLITE, options, worker
from tests.adapters.hub_harness import CAPABILITY, QUEUE, HubRig, running_hub
from tests.adapters.test_hub_admin import credential_id
from tests.adapters.test_hub_dashboard import sign_in
from tests.adapters.test_hub_metrics import scrape, value


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


@attrs.define(eq=False)
class Events:
    """The client's end of one `/v1/events` stream."""

    stream: trio.abc.Stream
    connection: h11.Connection = attrs.Factory(lambda: h11.Connection(h11.CLIENT))
    status: int = 0
    content_type: str = ""
    _text: str = ""
    ended: bool = False

    async def start(self, headers: Sequence[tuple[str, str]]) -> None:
        request = h11.Request(
            method="GET", target="/v1/events", headers=[("host", "hub.test"), *headers]
        )
        await self.stream.send_all(
            self.connection.send(request) + self.connection.send(h11.EndOfMessage())
        )
        while not self.status:
            event = await self._event()
            if isinstance(event, h11.Response):
                self.status = event.status_code
                self.content_type = dict(event.headers).get(b"content-type", b"").decode()

    async def tick(self) -> dict[str, Any] | None:
        """The next tick's data; None once the stream has ended."""
        while "\n\n" not in self._text:
            event = await self._event()
            if isinstance(event, h11.Data):
                self._text += bytes(event.data).decode()
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                self.ended = True
                return None
        raw, self._text = self._text.split("\n\n", 1)
        kind, data = raw.split("\n")
        assert kind == "event: tick"
        return dict(json.loads(data.removeprefix("data: ")))

    async def _event(self) -> Any:
        while (event := self.connection.next_event()) is h11.NEED_DATA:
            self.connection.receive_data(bytes(await self.stream.receive_some()))
        return event


@asynccontextmanager
async def events(rig: HubRig, headers: Sequence[tuple[str, str]]) -> AsyncIterator[Events]:
    async with await rig.open_stream() as stream:
        reader = Events(stream)
        await reader.start(headers)
        yield reader


@SQLITE
async def test_the_stats_count_a_submission_and_a_finish_as_prometheus_does(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token, admin = rig.credential(), rig.credential("*", Right.ADMIN)
        started_ms = rig.now_ms()
        await trio.sleep(15)  # into the next bucket
        await rig.submit(token)
        async with rig.worker(token) as client:
            offer = await client.offer()
            await trio.sleep(0.25)
            await client.start(offer)
            await trio.sleep(1.5)
            await client.finish(offer, Succeeded(result="1"))
        await rig.submit(token)  # queued still
        status, stats = await rig.http("GET", "/v1/stats", token=admin)
        samples = await scrape(rig)
    assert status == 200
    assert stats["hub_id"] == rig.hub.hub_id
    assert (stats["started_at_ms"], stats["step_ms"], stats["window_ms"]) == (
        started_ms,
        10_000,
        3_600_000,
    )
    first = started_ms - started_ms % 10_000
    assert stats["t"] == list(range(first, stats["at_ms"] + 1, 10_000))[: len(stats["t"])]
    assert stats["t"][-1] <= stats["at_ms"] < stats["t"][-1] + 10_000
    q = stats["queues"][QUEUE]
    assert all(len(values) == len(stats["t"]) for values in q.values())
    assert sum(q["submissions"]) == value(samples, "blockx_hub_submissions_total", queue=QUEUE) == 2
    assert sum(q["succeeded"]) == 1
    for outcome in ("succeeded", "failed", "unknown"):
        counted = value(samples, "blockx_hub_finishes_total", queue=QUEUE, outcome=outcome.upper())
        assert sum(q[outcome]) == counted
    assert q["submissions"][0] == 0  # the start's bucket: nothing then
    (waited,) = [v for v in q["queue_wait_p50_ms"] if v is not None]
    (ran,) = [v for v in q["attempt_p99_ms"] if v is not None]
    assert 250 / 1.1 <= waited <= 250 * 1.1
    assert 1500 / 1.1 <= ran <= 1500 * 1.1


@SQLITE
async def test_the_workers_show_a_connected_automatic_workers_session(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    release = trio.Event()

    async def hold(execution: WorkerExecution) -> Any:
        await release.wait()
        return {"ok": True}

    async with running_hub(hub_url) as rig:
        token, admin = rig.credential(), rig.credential("*", Right.ADMIN)
        signed = await sign_in(rig, admin)
        task = await rig.submit(token)
        before_ms = rig.now_ms()
        auto = worker(rig, token, options(hold, capacity=3))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(auto.run)
            while True:
                reply = await rig.exchange("GET", "/v1/workers", headers=signed.headers())
                shown = reply.json()
                attempts = [a for w in shown["workers"] for a in w["attempts"]]
                if attempts and attempts[0]["status"] == "STARTED":
                    break
                await trio.sleep(0.1)
            await trio.sleep(20)  # heartbeats go on
            later = await rig.http("GET", "/v1/workers", token=admin)
            release.set()
            nursery.cancel_scope.cancel()
        gone = await rig.http("GET", "/v1/workers", token=admin)
    (session,) = shown["workers"]
    assert shown["hub_id"] == rig.hub.hub_id
    assert session["queue_id"] == QUEUE
    assert session["credential_id"] == credential_id(token)
    assert session["capabilities"] == [attrs.asdict(CAPABILITY)]
    assert (session["capacity"], session["held"], session["draining"]) == (3, 1, False)
    assert session["attempts"][0]["task_id"] == task["task_id"]
    assert session["attempts"][0]["attempt_id"]
    assert before_ms <= session["opened_at_ms"] <= session["last_heard_ms"] <= shown["at_ms"]
    (still,) = later[1]["workers"]
    assert still["instance_id"] == session["instance_id"]
    assert still["opened_at_ms"] == session["opened_at_ms"]
    assert still["last_heard_ms"] >= later[1]["at_ms"] - 10_000  # heard within a heartbeat or so
    assert gone == (200, {"hub_id": rig.hub.hub_id, "at_ms": gone[1]["at_ms"], "workers": []})


@SQLITE
async def test_events_tick_at_once_then_every_second_and_end_when_the_hub_drains(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        signed = await sign_in(rig, rig.credential("*", Right.ADMIN))
        await rig.submit(rig.credential())
        async with events(rig, signed.headers()) as stream:
            opened_s = trio.current_time()
            first = await stream.tick()
            at_once_s = trio.current_time() - opened_s
            second = await stream.tick()
            third = await stream.tick()
            drain_s = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(rig.hub.drain)
                end = await stream.tick()
            drained_after_s = trio.current_time() - drain_s
    assert (stream.status, stream.content_type) == (200, "text/event-stream")
    assert first is not None
    assert second is not None
    assert third is not None
    assert at_once_s < 0.1
    assert second["at_ms"] - first["at_ms"] == third["at_ms"] - second["at_ms"] == 1000
    (queue,) = first["queues"]
    assert (queue["queue_id"], queue["tasks"]["QUEUED"]) == (QUEUE, 1)
    stats = first["stats"]
    assert stats["hub_id"] == rig.hub.hub_id
    assert 1 <= len(stats["t"]) <= 2
    assert stats["queues"][QUEUE]["submissions"][-1] == 1
    assert all(len(values) == len(stats["t"]) for values in stats["queues"][QUEUE].values())
    assert end is None
    assert stream.ended
    assert drained_after_s < 0.1


@SQLITE
async def test_one_read_a_second_serves_every_stream_and_none_is_made_without(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        admin = rig.credential("*", Right.ADMIN)
        ticker = rig.hub.live.ticker
        await trio.sleep(5)
        idle_reads = ticker.reads
        async with (
            events(rig, bearer(admin)) as one,
            events(rig, bearer(admin)) as two,
            events(rig, bearer(admin)) as three,
        ):
            start_reads = ticker.reads
            for _ in range(5):
                ticks = [await stream.tick() for stream in (one, two, three)]
                assert len({json.dumps(tick) for tick in ticks}) == 1  # the same event
            reads = ticker.reads - start_reads
        await trio.testing.wait_all_tasks_blocked()
        after = ticker.reads
        await trio.sleep(5)
    assert idle_reads == 0
    assert 4 <= reads <= 5  # the first tick may have been read for the first stream alone
    assert ticker.reads == after
    assert ticker.streams == 0


@SQLITE
async def test_the_33rd_stream_is_refused(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        admin = rig.credential("*", Right.ADMIN)
        async with trio.open_nursery() as nursery:
            opened: list[Events] = []

            async def keep_open() -> None:
                async with events(rig, bearer(admin)) as stream:
                    opened.append(stream)
                    await trio.sleep_forever()

            for _ in range(MAX_STREAMS):
                nursery.start_soon(keep_open)
            await trio.testing.wait_all_tasks_blocked()
            refused = await rig.exchange("GET", "/v1/events", headers=bearer(admin))
            nursery.cancel_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        async with events(rig, bearer(admin)) as again:
            tick = await again.tick()
    assert [stream.status for stream in opened] == [200] * MAX_STREAMS
    assert refused.status == 503
    assert str(MAX_STREAMS) in refused.json()["error"]
    assert again.status == 200
    assert tick is not None


@SQLITE
async def test_a_client_that_does_not_read_its_ticks_is_dropped(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    """Its connection holds what the hub sends until the client reads it (a lockstep
    stream): the ticks pile up, and the stream is dropped a few ticks on."""
    async with running_hub(hub_url) as rig:
        admin = rig.credential("*", Right.ADMIN)
        client_end, hub_end = trio.testing.lockstep_stream_pair()
        rig.nursery.start_soon(rig.hub.serve_connection, hub_end)
        slow = Events(client_end)
        await slow.start(bearer(admin))  # then it reads no more
        async with events(rig, bearer(admin)) as fast:
            ticks = 0
            while rig.hub.live.ticker.streams == 2:
                assert await fast.tick() is not None
                ticks += 1
            still = await fast.tick()
        await client_end.aclose()
    assert slow.status == 200
    assert STREAM_BUFFER <= ticks <= STREAM_BUFFER + 3
    assert still is not None


@SQLITE
async def test_the_stream_of_a_revoked_credential_ends(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token, other = rig.credential("*", Right.ADMIN), rig.credential("*", Right.ADMIN)
        producer = rig.credential()
        async with events(rig, bearer(producer)) as refused:
            pass
        async with events(rig, bearer(token)) as revoked, events(rig, bearer(other)) as kept:
            assert await revoked.tick() is not None
            await rig.http("POST", f"/v1/credentials/{credential_id(token)}:revoke", token=other)
            while await revoked.tick() is not None:
                pass
            assert await kept.tick() is not None
    assert refused.status == 403
    assert revoked.ended
    assert not kept.ended
