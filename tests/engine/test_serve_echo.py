"""`/v1/completions` with `echo` and `logprobs` (OpenAI's legacy shape), vLLM's `prompt_logprobs`, `max_tokens: 0`,
several prompts in one request, and `--alias` (issue 46 items 1 and 5), against the official `openai` client
and the server on 127.0.0.1 with the default model.

The prompt's log-probs are `Engine.score`'s (the project's one scorer); an echoed answer's own tokens are the
answer the same request gets without echo; several prompts get one choice per prompt x n, numbered so.
"""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai", reason="needs the openai package (the test extra)")

from engine.cli.input import UsageError  # noqa: E402
from engine.cli.serve import aliases  # noqa: E402
from engine.serve.limits import MAX_PROMPTS  # noqa: E402
from serve_helpers import served_default_model  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]
TEXTS = ["The capital of France is Paris", "Two plus two equals four, said the teacher.", "Hello world"]


@pytest.fixture(scope="module")
def served():
    from engine.serve import ServeOptions

    with served_default_model(options=ServeOptions(aliases=("gpt-3.5-turbo", "text-davinci-003"))) as triple:
        yield triple


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[1].url, api_key="unused", max_retries=0, timeout=120)


def test_echo_scores_every_prompt_as_engine_score_does(served, client):
    engine = served[0]
    got = client.completions.create(model="SmolLM2-135M-Instruct", prompt=TEXTS, echo=True, logprobs=5,
                                    max_tokens=0)
    assert [c.index for c in got.choices] == [0, 1, 2]
    for choice, text in zip(got.choices, TEXTS):
        lp = choice.logprobs
        want = engine.score(text, top_n=5)
        assert choice.text == text and choice.finish_reason == "length"
        assert "".join(lp.tokens) == text and len(lp.tokens) == len(want.token_ids)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
        assert lp.token_logprobs[1:] == pytest.approx([t.logprob for t in want.tokens], abs=1e-4)
        for top, scored in zip(lp.top_logprobs[1:], want.tokens):
            assert list(top) == [p.text for p in scored.top if not p.is_rest][:5]
        assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert got.usage.prompt_tokens == sum(len(engine.tokenizer.encode(t)) for t in TEXTS)
    assert got.usage.completion_tokens == 0


def test_echo_with_an_answer_is_prompt_then_the_same_answer(served, client):
    engine = served[0]
    kw = dict(model="SmolLM2-135M-Instruct", max_tokens=6, temperature=0, logprobs=2)
    plain = client.completions.create(prompt=TEXTS[0], **kw).choices[0]
    echoed = client.completions.create(prompt=TEXTS[0], echo=True, **kw).choices[0]
    n_prompt = len(engine.tokenizer.encode(TEXTS[0]))
    assert echoed.text == TEXTS[0] + plain.text and plain.text
    lp = echoed.logprobs
    assert lp.tokens[n_prompt:] == plain.logprobs.tokens
    assert lp.token_logprobs[n_prompt:] == plain.logprobs.token_logprobs
    assert lp.text_offset[n_prompt:] == [len(TEXTS[0]) + o for o in plain.logprobs.text_offset]
    assert lp.token_logprobs[1:n_prompt] == pytest.approx([t.logprob for t in engine.score(TEXTS[0]).tokens],
                                                          abs=1e-4)


def test_lm_evals_one_token_echo_comes_from_the_scoring_pass_and_is_recorded(served, client):
    """lm-eval's request (echo, logprobs 1, max_tokens 1, a list of prompts): each answer token is the one the
    decode loop gives without echo, taken from the scoring pass's last position (its fingerprint says so), and
    recorded like any answer (start, its token, end)."""
    engine, _, sink = served
    kw = dict(model="SmolLM2-135M-Instruct", max_tokens=1, temperature=0, logprobs=1)
    plain = [client.completions.create(prompt=t, **kw).choices[0] for t in TEXTS[:2]]
    sink.clear()
    echoed = client.completions.create(prompt=TEXTS[:2], echo=True, seed=1234, **kw).choices
    for text, p, e in zip(TEXTS, plain, echoed):
        n_prompt = len(engine.tokenizer.encode(text))
        assert e.text == text + p.text and e.finish_reason == p.finish_reason
        assert e.logprobs.tokens[n_prompt:] == p.logprobs.tokens
        assert e.logprobs.token_logprobs[n_prompt:] == pytest.approx(p.logprobs.token_logprobs, abs=1e-4)
    ended = sink.wait_ends(2)
    for exchange, p in zip(sorted(ended, key=lambda x: x.id), plain):
        choice = exchange.choices[0]
        assert [ev.token_text for ev in choice.events] == p.logprobs.tokens and len(sink.tokens[exchange.id]) == 1
        assert "next_token_from" in choice.stats.fingerprint.extras and choice.finish_reason == p.finish_reason


def test_vllm_prompt_logprobs(served, client):
    engine = served[0]
    got = client.completions.create(model="SmolLM2-135M-Instruct", prompt=TEXTS[0], max_tokens=0,
                                    extra_body={"prompt_logprobs": 3})
    rows = got.choices[0].model_extra["prompt_logprobs"]
    want = engine.score(TEXTS[0], top_n=3)
    assert rows[0] is None and len(rows) == len(want.token_ids)
    for row, scored in zip(rows[1:], want.tokens):
        mine = row[str(scored.token_id)]
        assert mine["logprob"] == pytest.approx(scored.logprob, abs=1e-4) and mine["rank"] == scored.rank + 1
        assert mine["decoded_token"] == scored.token_text
        assert {e["rank"] for e in row.values()} == {1, 2, 3, scored.rank + 1}
    assert got.choices[0].text == "" and got.choices[0].logprobs is None


def test_several_prompts_each_get_their_own_answers(client):
    kw = dict(model="SmolLM2-135M-Instruct", max_tokens=5, temperature=0.9, seed=3)
    alone = [client.completions.create(prompt=p, n=2, **kw) for p in TEXTS[:2]]
    together = client.completions.create(prompt=TEXTS[:2], n=2, **kw)
    assert [c.index for c in together.choices] == [0, 1, 2, 3]
    assert [c.text for c in together.choices] == [c.text for a in alone for c in a.choices]
    assert together.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)


def test_an_alias_is_served_under_its_name_and_an_unknown_name_is_a_404(served, client):
    got = client.completions.create(model="gpt-3.5-turbo", prompt="Hi", max_tokens=2, temperature=0)
    assert got.model == "gpt-3.5-turbo"
    chat = client.chat.completions.create(model="text-davinci-003", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=2)
    assert chat.model == "text-davinci-003"
    assert [m.id for m in client.models.list()] == ["SmolLM2-135M-Instruct", "gpt-3.5-turbo", "text-davinci-003"]
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4o", prompt="Hi", max_tokens=2)
    assert "'gpt-4o' does not exist here" in str(e.value) and "--alias" in str(e.value)


def test_models_say_what_each_can_do(served, client):
    """`GET /v1/models`: every name (the model, each alias) with the same capabilities, and what they say holds:
    tools and exact prompt log-probs for a model run here, no embeddings (the route is a 404)."""
    import httpx

    listed = client.models.list().data
    caps = [m.model_extra["capabilities"] for m in listed]
    assert len(caps) == 3 and all(c == caps[0] for c in caps)
    c = caps[0]
    assert c["tools"] and c["echo"] and c["prompt_logprobs_exact"] and c["responses"] and c["messages"]
    assert c["max_prompts"] == MAX_PROMPTS and c["embeddings"] is False
    assert httpx.post(f"{served[1].url}/embeddings", json={"input": "hi"}, timeout=10).status_code == 404


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": ["a"] * (MAX_PROMPTS + 1), "max_tokens": 0}, "prompt", f"at most {MAX_PROMPTS}"),
    ({"prompt": ["ok", 7], "max_tokens": 1}, "prompt", "a string, a non-empty list of token ids"),
    ({"prompt": ["ok", []], "max_tokens": 1}, "prompt[1]", "prompt[1] must be"),
    ({"prompt": "a", "echo": True, "logprobs": 1, "stream": True}, "stream", "stream with echo"),
    ({"prompt": ["a", "b"], "stream": True}, "stream", "stream with several prompts"),
    ({"prompt": "a", "max_tokens": -1}, "max_tokens", "from 0"),
    ({"prompt": "a", "prompt_logprobs": 101, "max_tokens": 0}, "prompt_logprobs", "from 0 to 100"),
    ({"prompt": "a", "echo": "yes"}, "echo", "true or false"),
    ({"prompt": [[1, 2], [3, 10**9]], "max_tokens": 0}, "prompt[1]", "vocabulary"),
])
def test_bad_echo_and_prompt_lists_are_400s_in_words(served, body, param, words):
    import httpx

    r = httpx.post(f"{served[1].url}/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_alias_flags_repeat_and_split_on_commas():
    assert aliases(["gpt-3.5-turbo,gpt-4o-mini", "gpt-3.5-turbo", " davinci "]) == \
        ("gpt-3.5-turbo", "gpt-4o-mini", "davinci")
    with pytest.raises(UsageError, match="--alias takes model names"):
        aliases(["a,,b"])
