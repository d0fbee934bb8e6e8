"""A constraint on a model on a server (llama-cpp-python's server on 127.0.0.1, the default model).

We sample: the mask applies to the server's top N only, checked byte by byte, and the stage says so.
The server samples: refused in words until the constraint is sent to the server.
"""

from __future__ import annotations

import pytest

from engine.backends.remote.errors import UnsupportedByServerError
from engine.constraints import Constraint
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling import SamplerSettings

pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def remote(llama_server_url):
    from engine.backends.remote import RemoteBackend

    backend = RemoteBackend.connect(llama_server_url)
    yield backend
    backend.close()


def test_we_sample_masks_the_servers_top_n(remote):
    request = GenerationRequest(messages=({"role": "user", "content": "Pick a colour."},),
                                sampler=SamplerSettings(temperature=0.0), max_new_tokens=8,
                                constraint=Constraint.choice(["red", "green", "blue"]))
    events = list(remote.events(request, None))
    done = events[-1]
    assert isinstance(done, Done) and done.stats.text in ("red", "green", "blue"), done.stats
    steps = [e.constraint for e in events if isinstance(e, TokenEvent)]
    assert steps and all("top" in s.note and "only" in s.note for s in steps)
    assert steps[0].disallowed  # the server's favourites that are not a colour were removed


def test_server_sampling_with_a_constraint_is_refused_in_words(remote):
    request = GenerationRequest(prompt="x", server_sampling=True, constraint=Constraint.regex("[0-9]+"))
    with pytest.raises(UnsupportedByServerError, match="not sent to servers yet"):
        list(remote.events(request, None))
