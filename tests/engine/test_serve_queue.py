"""engine.serve.fair_queue: turns at one model go round the clients, a waiter that leaves gives its place up,
and past the waiting limit the server is busy (503)."""

from __future__ import annotations

import asyncio

import pytest

from engine.serve.errors import ApiError
from engine.serve.fair_queue import FairQueue


def test_turns_alternate_between_clients():
    """Client a sends three requests before b sends one: b's runs second, not fourth."""
    order: list[str] = []

    async def main() -> None:
        queue = FairQueue(max_running=1)
        gate = asyncio.Event()

        async def request(client: str, name: str) -> None:
            async with queue.turn(client):
                order.append(name)
                await gate.wait()

        tasks = [asyncio.ensure_future(request("a", f"a{i}")) for i in range(3)]
        await asyncio.sleep(0)
        tasks.append(asyncio.ensure_future(request("b", "b0")))
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*tasks)
        assert queue.running == 0 and queue.waiting == 0

    asyncio.run(main())
    assert order == ["a0", "b0", "a1", "a2"]


def test_a_waiter_that_leaves_gives_its_place_up():
    async def main() -> list[str]:
        queue = FairQueue(max_running=1)
        order: list[str] = []
        release = asyncio.Event()

        async def request(client: str) -> None:
            async with queue.turn(client):
                order.append(client)
                await release.wait()

        first = asyncio.ensure_future(request("a"))
        await asyncio.sleep(0)
        leaving = asyncio.ensure_future(request("b"))
        staying = asyncio.ensure_future(request("c"))
        await asyncio.sleep(0)
        leaving.cancel()  # the client went away while waiting
        await asyncio.sleep(0)
        assert queue.waiting == 1
        release.set()
        await asyncio.gather(first, staying)
        assert queue.running == 0
        return order

    assert asyncio.run(main()) == ["a", "c"]


def test_past_the_waiting_limit_the_server_is_busy():
    async def main() -> None:
        queue = FairQueue(max_running=1, max_waiting=2)
        hold = asyncio.Event()

        async def request() -> None:
            async with queue.turn("x"):
                await hold.wait()

        tasks = [asyncio.ensure_future(request()) for _ in range(3)]  # one runs, two wait
        await asyncio.sleep(0)
        with pytest.raises(ApiError) as e:
            async with queue.turn("y"):
                pass
        assert e.value.status == 503 and "busy" in e.value.message
        hold.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
