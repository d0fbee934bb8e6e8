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


def test_riders_waiting_together_share_the_next_turn_in_fair_order():
    """Requests that can share a batch come along with the next turn, as many as `joins` lets, each client's
    oldest first; one that cannot share (no rider) keeps its place and its line's later requests wait."""
    log: list[tuple[str, object]] = []

    async def main() -> None:
        queue = FairQueue(max_running=1, joins=lambda taken, candidate: len(taken) < 3)
        hold = asyncio.Event()

        async def request(client: str, name: str, rider: bool = True) -> None:
            async with queue.turn(client, rider=name if rider else None) as turn:
                log.append((name, "joined" if turn.joined else list(turn.riders)))
                if name == "first":
                    await hold.wait()

        tasks = [asyncio.ensure_future(request("a", "first"))]
        await asyncio.sleep(0)
        for client, name, rider in [("a", "a1", True), ("a", "a2", True), ("b", "b1", False), ("b", "b2", True),
                                    ("c", "c1", True), ("c", "c2", True)]:
            tasks.append(asyncio.ensure_future(request(client, name, rider)))
            await asyncio.sleep(0)
        hold.set()
        await asyncio.gather(*tasks)
        assert queue.running == 0 and queue.waiting == 0

    asyncio.run(main())
    turns = [(name, what) for name, what in log if what != "joined"]
    # b (never served) goes first but runs alone; then c's oldest, with a's and b's next (joins: 3 in all; c,
    # holding the turn, counts as just served); then a's last (served before c), with c's next.
    assert turns == [("first", []), ("b1", []), ("c1", ["a1", "b2"]), ("a2", ["c2"])]
    assert {name for name, what in log if what == "joined"} == {"a1", "b2", "c2"}


def test_a_handed_over_turn_ends_when_released_not_with_its_block():
    async def main() -> None:
        queue = FairQueue(max_running=1)
        async with queue.turn("a") as turn:
            release = turn.hand_over()
        assert queue.running == 1  # the batch it started still runs
        waiter = asyncio.ensure_future(_enter(queue, "b"))
        await asyncio.sleep(0.01)
        assert not waiter.done() and queue.waiting == 1
        release()
        release()  # once only: a second call frees nothing more
        await waiter
        assert queue.running == 0

    asyncio.run(main())


async def _enter(queue: FairQueue, client: str) -> None:
    async with queue.turn(client):
        pass
