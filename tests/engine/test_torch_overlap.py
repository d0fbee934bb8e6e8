"""The torch backend's OverlappedForward: the forward on a helper thread while the report is built."""

from __future__ import annotations

import pytest

from engine.backends.torch.backend import TorchBackend
from engine.capabilities import OverlappedForward
from engine.decode import loop as decode
from engine.decode.loop import generate_events
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

GREEDY = SamplerSettings(temperature=0.0)


class _NoBackend:
    """Stands for OverlappedForward in the decode loop for the run without overlap: no backend is one."""


@pytest.fixture
def tiny(tiny_llama_folder):
    backend = TorchBackend(tiny_llama_folder, spec="tiny", display_name="tiny", compile_step=False)
    yield backend
    backend.close()


def test_overlapped_decode_gives_the_same_tokens_and_logprobs(tiny, monkeypatch):
    assert isinstance(tiny, OverlappedForward)
    req = GenerationRequest(prompt="overlap me", sampler=GREEDY, max_new_tokens=24, ignore_eos=True, top_n=5)
    overlapped = list(generate_events(tiny, req))
    tiny.trim_cache(0)
    monkeypatch.setattr(decode, "OverlappedForward", _NoBackend)  # the decode loop then calls forward alone
    plain = list(generate_events(tiny, req))
    assert overlapped[-1].stats.token_ids == plain[-1].stats.token_ids
    assert len(overlapped) == len(plain)
    for a, b in zip(overlapped[:-1], plain[:-1]):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
        assert [t.token_id for t in a.top_model] == [t.token_id for t in b.top_model]


def test_forward_exception_wins_and_both_have_finished(tiny):
    finished = []

    def work():
        finished.append("work")
        raise ValueError("work failed")

    with pytest.raises(Exception) as caught:
        tiny.forward_during([10**9], work)  # an id past the vocabulary: the forward raises
    assert not isinstance(caught.value, ValueError)
    assert finished == ["work"]
    assert tiny.forward_during([5], lambda: "done")[1] == "done"  # the cache was reset, the pool still works


def test_the_row_is_a_copy_and_the_pool_closes_with_the_backend(tiny):
    row, _ = tiny.forward_during([5, 6], lambda: None)
    kept = row.copy()
    tiny.forward_during([7], lambda: None)
    assert (row == kept).all()
    pool = tiny._overlap
    tiny.close()
    assert tiny._overlap is None and pool._pool is None
