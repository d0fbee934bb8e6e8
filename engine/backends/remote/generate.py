"""Events for one request on a remote model: the worker's single entry point into this package.

- `request.server_sampling`: the server samples (`server_stream`).
- otherwise "we sample": the ordinary decode loop over `RemoteBackend.forward`,
  with every stage snapshot noted "top N from server". A server error after
  some tokens ends the run with a Done(finish_reason="error") that keeps them.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

from engine.backends.remote.errors import ServerError
from engine.backends.remote.server_stream import server_sampled_events
from engine.decode import generate_events
from engine.events import Done, Event, GenerationStats, TokenEvent
from engine.request import GenerationRequest


def remote_events(backend, request: GenerationRequest, cancel: threading.Event | None = None) -> Iterator[Event]:
    cancel = cancel or threading.Event()
    if request.server_sampling:
        yield from server_sampled_events(backend, request, cancel)
        return
    note = f"top {backend.top_n} from server, renormalised over them"
    received: list[TokenEvent] = []
    events = generate_events(backend, request, cancel)
    try:
        for event in events:
            if isinstance(event, TokenEvent):
                if event.stages is not None:
                    event = dataclasses.replace(
                        event, stages=tuple(dataclasses.replace(s, note=note) for s in event.stages)
                    )
                received.append(event)
            yield event
    except ServerError as e:
        if not received:
            raise
        # The tokens already chosen stay: end like any other generation, with the reason.
        yield Done(GenerationStats(
            finish_reason="error", prompt_tokens=0, reused_tokens=0, generated_tokens=len(received),
            time_to_first_token_s=0.0, decode_tokens_per_s=0.0, total_s=0.0, peak_memory_bytes=0, seed=-1,
            text="".join(ev.text for ev in received), token_ids=tuple(ev.token_id for ev in received), error=str(e),
        ))
    finally:
        events.close()
