"""`LanguageModel`: the research interface over a loaded torch or MLX backend.

- `generate(inputs, ...)`: batch generation, prompt + generated ids as one array (rows end at
  end-of-sequence; -1 where no token is); `generate_output` adds each row's length.
- `score(texts)` / `score_pairs([(context, continuation), ...])`: teacher-forced per-token log-probs,
  ranks and totals, every text on the one batch runner (engine/experiments/batch_score.py).
- `next_token_logprobs_sync(ids)` / `await next_token_logprobs(ids)`: full-vocabulary
  normalized logprobs, cached in a token trie (rows and KV states within one byte budget,
  least recently used out first: `cache_budget_bytes`); concurrent async requests that
  arrive within `batch_window_s` run as one batch, identical ones once.
- `sample` / `batch_sample`: ancestral sampling built on the cached logprobs.
- `beam_search(...)`, `agenerate(...)`.
- `layer_logprobs(ids, position, top_k)`: each layer's top-k at a position (the logit lens).

All model work runs on one private thread (MLX streams are per thread and
torch is not re-entrant), so async callers never block their event loop.
Every entry point checks each prompt against the model's context length
before any forward pass (`ContextLengthError`, naming the prompt).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from engine.research.batch_generate import Generation, settings_for, as_rows, check_rows_fit, generate_batch
from engine.research.beam import BeamResult, beam_search
from engine.backend import shared_prefix_length
from engine.capabilities import BatchRunners, LayerLens, require
from engine.research.constrained import ConstrainedSample, allowed_mask, constrained_sample, run_for
from engine.research.trie import TokenTrie
from engine.constraints import Constraint
from engine.sampling import SamplerChain, SamplerSettings
from engine.tokenizer import check_token_ids, vocabulary_size

if TYPE_CHECKING:
    from engine.backend import Backend
    from engine.experiments.batch_score import ScoreItem
    from engine.experiments.score import ScoreResult
    from engine.steering import Steering, SteeringEffect


_T = TypeVar("_T")
MIN_SHARED_PREFIX = 8  # tokens: below this, running the prefix separately costs more than it saves


def _normalize(logits: np.ndarray) -> np.ndarray:
    m = logits.max(axis=-1, keepdims=True)
    return (logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))).astype(np.float32)


def _check_ids(token_ids: Sequence[int], n_vocab: int = 0) -> tuple[int, ...]:
    """`token_ids` as a tuple of ints, each checked against the vocabulary (TokenIdError in words)."""
    ids = tuple(token_ids)
    if not ids:
        raise ValueError("token_ids is empty: at least one token is needed to predict the next one")
    check_token_ids(ids, n_vocab)
    return tuple(int(t) for t in ids)


class LanguageModel:
    def __init__(
        self,
        backend: Backend,
        *,
        cache_budget_bytes: int = 1 << 30,
        kv_budget_bytes: int | None = None,
        max_batch_size: int = 32,
        batch_window_s: float = 0.005,
    ) -> None:
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.context_length = int(getattr(backend.info, "context_length", 0) or 0)  # 0: unknown, unchecked
        # The ids a caller may pass: the tokenizer's vocabulary, within the model's logits.
        sizes = [n for n in (vocabulary_size(self.tokenizer), int(getattr(backend.info, "vocab_size", 0) or 0)) if n > 0]
        self.n_vocab = min(sizes) if sizes else 0
        self.runner = require(backend, BatchRunners, "the research API").batch_runner()
        self._states = self.runner.supports_row_states()
        # One byte budget for everything cached (logprob rows, KV states, the tree), least recently used
        # out first; `kv_budget_bytes` caps the KV states within it.
        self.trie = TokenTrie(cache_budget_bytes, self.runner.state_nbytes, kv_budget_bytes)
        self.max_batch_size = max_batch_size
        self.batch_window_s = batch_window_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="logitlab-research")
        self._pending: dict[tuple[int, ...], asyncio.Future] = {}
        self._flush_handle: asyncio.TimerHandle | None = None

    @classmethod
    def load(cls, spec: str | None = None, *, backend: str = "auto", load_options: dict | None = None,
             **kwargs: Any) -> "LanguageModel":  # kwargs: the constructor's
        """Load `spec`; `load_options` go to `engine.load_model` (device, dtype, trust_remote_code, ...)."""
        from engine.open_model import load_model

        return cls(load_model(spec, backend=backend, **(load_options or {})), **kwargs)

    @property
    def forward_calls(self) -> int:
        return self.runner.forward_calls

    # --- next-token logprobs ---------------------------------------------------

    def batch_next_token_logprobs_sync(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """(B, V) normalized logprobs; cached prefixes are free, the rest is one forward per chunk."""
        keys = [_check_ids(ids, self.n_vocab) for ids in batch]
        check_rows_fit(keys, 0, self.context_length)
        out: dict[tuple[int, ...], np.ndarray] = {}
        todo = []
        for k in dict.fromkeys(keys):  # de-duplicated, order kept
            hit = self.trie.cached_logprobs(k)
            if hit is not None:
                out[k] = hit
            else:
                todo.append(k)
        for start in range(0, len(todo), self.max_batch_size):
            chunk = todo[start : start + self.max_batch_size]
            self._warm_shared_prefix(chunk)
            rows = []
            for k in chunk:
                depth, state = self.trie.deepest_state(k[:-1]) if self._states else (0, None)
                rows.append((state, k[depth:]))
            logits, states = self.runner.forward_rows(rows, keep_states=self._states)
            logprobs = _normalize(logits)
            for k, lp, st in zip(chunk, logprobs, states):
                self.trie.store(k, lp, st)
                out[k] = lp
        return np.stack([out[k] for k in keys])

    def _warm_shared_prefix(self, chunk: list[tuple[int, ...]]) -> None:
        """Run the chunk's longest common prefix once, so every row then extends its KV state.

        Without this, 32 requests sharing a 200-token prefix would each run
        those 200 tokens in the batch: 32x the work of running them once.
        """
        if not self._states or len(chunk) < 2:
            return
        lcp = shared_prefix_length(chunk, 0)  # each row keeps at least its own last token
        first = chunk[0]
        depth, _ = self.trie.deepest_state(first[:lcp])
        if lcp - depth >= MIN_SHARED_PREFIX:
            self.batch_next_token_logprobs_sync([first[:lcp]])

    def next_token_logprobs_sync(self, token_ids: Sequence[int]) -> np.ndarray:
        return self.batch_next_token_logprobs_sync([token_ids])[0]

    async def next_token_logprobs(self, token_ids: Sequence[int]) -> np.ndarray:
        """Awaitable; requests arriving within `batch_window_s` of each other share one forward."""
        key = _check_ids(token_ids, self.n_vocab)
        check_rows_fit([key], 0, self.context_length)  # here, not in the batch: one bad row must not fail the others
        hit = self.trie.cached_logprobs(key)
        if hit is not None:
            return hit
        loop = asyncio.get_running_loop()
        fut = self._pending.get(key)
        if fut is None:
            fut = self._pending[key] = loop.create_future()
            if len(self._pending) >= self.max_batch_size:
                self._flush()
            elif self._flush_handle is None:
                self._flush_handle = loop.call_later(self.batch_window_s, self._flush)
        return await asyncio.shield(fut)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        pending, self._pending = self._pending, {}
        if not pending:
            return
        keys = list(pending)
        work = asyncio.get_running_loop().run_in_executor(self._executor, self.batch_next_token_logprobs_sync, keys)

        def resolve(done: asyncio.Future) -> None:
            err = done.exception()
            for i, k in enumerate(keys):
                if pending[k].done():
                    continue
                if err is not None:
                    pending[k].set_exception(err)
                else:
                    pending[k].set_result(done.result()[i])

        work.add_done_callback(resolve)

    async def batch_next_token_logprobs(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        return np.stack(await asyncio.gather(*(self.next_token_logprobs(ids) for ids in batch)))

    def clear_cache(self) -> None:
        self.trie.clear()

    # --- teacher-forced scoring of many texts (engine/experiments/batch_score.py) ----

    def score(self, texts: Sequence[str], *, top_n: int = 10) -> list["ScoreResult"]:
        """Each text's per-token log-probs, ranks, entropies and total (`ScoreResult`), one per text, in order.

        All texts run on this model's one batch runner (one context, made at load), each as its own
        sequence; the numbers equal `Engine.score`'s within float32 rounding. A server model (no
        all-positions runner) goes step by step.
        """
        from engine.experiments.batch_score import ScoreItem

        if isinstance(texts, str):
            raise TypeError("score takes a list of texts; for one text write score([text])")
        return self._score_items([ScoreItem(text=t) for t in texts], top_n)

    def score_pairs(self, pairs: Sequence[tuple[str, str]], *, top_n: int = 10) -> list["ScoreResult"]:
        """Score each continuation after its context: `[(context, continuation), ...]` -> one `ScoreResult` each.

        Only the continuation's tokens are scored (`result.total_logprob` is log p(continuation | context));
        the two parts are tokenized separately, so no token straddles them.
        """
        from engine.experiments.batch_score import ScoreItem

        items = []
        for i, pair in enumerate(pairs):
            if isinstance(pair, str) or len(pair) != 2:
                raise ValueError(f"pair {i} must be (context, continuation), got {pair!r:.60}")
            items.append(ScoreItem(context=pair[0], continuation=pair[1]))
        return self._score_items(items, top_n)

    def _score_items(self, items: Sequence[ScoreItem], top_n: int) -> list["ScoreResult"]:
        from engine.experiments.batch_score import item_ids, score_on_runner
        from engine.experiments.score import score_step_by_step

        ids = [item_ids(self.tokenizer, item) for item in items]
        if not hasattr(self.runner, "position_logits"):  # a server: one request per position
            return [score_step_by_step(self.backend, i, context=c, top_n=top_n) for i, c in ids]
        return score_on_runner(self.backend, self.runner, ids, top_n=top_n)

    # --- sampling on top of the cache -------------------------------------------

    def sample(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] = (),
        temperature: float = 1.0,
        seed: int | None = None,
        sampler: SamplerSettings | None = None,
    ) -> tuple[list[int], float]:
        """Ancestral sampling through the trie; returns (generated ids, their total log-prob under the model).

        `sampler=SamplerSettings(...)` samples with every stage it sets (instead of `temperature`; its seed,
        when set, instead of `seed`).
        """
        ids = list(_check_ids(prompt_ids, self.n_vocab))
        check_rows_fit([ids], max_tokens, self.context_length)
        chain = SamplerChain(settings_for(sampler, seed, temperature=temperature), self.tokenizer)
        eos, total = set(eos_token_ids), 0.0
        out: list[int] = []
        for _ in range(max_tokens):
            lp = self.next_token_logprobs_sync(ids + out)
            tok = chain.pick(lp, np.asarray(ids + out), top_n=0).token_id
            out.append(tok)
            total += float(lp[tok])
            if tok in eos:
                break
        return out, total

    def batch_sample(
        self,
        prompt_ids_list: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] = (),
        temperature: float = 1.0,
        seed: int | None = None,
        sampler: SamplerSettings | None = None,
    ) -> list[tuple[list[int], float]]:
        """`sample` for many prompts, one batched forward per step across the still-running rows.

        Prompt i samples with seed + i (`sampler`'s seed + i when it sets one)."""
        prompts = [list(_check_ids(p, self.n_vocab)) for p in prompt_ids_list]
        check_rows_fit(prompts, max_tokens, self.context_length)
        settings = settings_for(sampler, seed, temperature=temperature)
        chains = [SamplerChain(settings.with_(seed=None if settings.seed is None else settings.seed + i), self.tokenizer)
                  for i in range(len(prompts))]
        outs: list[list[int]] = [[] for _ in prompts]
        totals = [0.0] * len(prompts)
        live = list(range(len(prompts)))
        eos = set(eos_token_ids)
        for _ in range(max_tokens):
            if not live:
                break
            lps = self.batch_next_token_logprobs_sync([prompts[i] + outs[i] for i in live])
            still = []
            for lp, i in zip(lps, live):
                tok = chains[i].pick(lp, np.asarray(prompts[i] + outs[i]), top_n=0).token_id
                outs[i].append(tok)
                totals[i] += float(lp[tok])
                if tok not in eos:
                    still.append(i)
            live = still
        return list(zip(outs, totals))

    # --- constrained sampling (engine/research/constrained.py) ------------------

    def allowed_tokens(self, constraint: Constraint, prefix_ids: Sequence[int] = ()) -> np.ndarray:
        """(V,) bool: the tokens `constraint` allows after `prefix_ids` (the tokens generated under it so far)."""
        n_vocab = int(self.backend.info.vocab_size)
        check_token_ids(prefix_ids, self.n_vocab)
        return allowed_mask(run_for(constraint, self.tokenizer, n_vocab, prefix_ids), n_vocab)

    def sample_constrained(self, prompt_ids: Sequence[int], constraint: Constraint, max_tokens: int,
                           temperature: float = 1.0, seed: int | None = None) -> ConstrainedSample:
        """Ancestral sampling masked by `constraint`, with the log mass kept as the sample's log weight."""
        ids = list(_check_ids(prompt_ids, self.n_vocab))
        check_rows_fit([ids], max_tokens, self.context_length)
        return constrained_sample(self.next_token_logprobs_sync, self.tokenizer, int(self.backend.info.vocab_size),
                                  ids, constraint, max_tokens, SamplerSettings(temperature=temperature, seed=seed))

    # --- inside the model: the layer view (logit lens) -------------------------

    def layer_logprobs(self, token_ids: Sequence[int], position: int | None = None,
                       top_k: int = 10) -> list[list[tuple[int, float]]]:
        """What each decoder layer predicts for token `position` (default: the next token after `token_ids`).

        One entry per layer, in order (L entries for L layers), each the top-k (token_id, logprob)
        pairs best first, layer i's output put through the model's final norm and unembedding (the
        logit lens); the last entry is the model's own next-token distribution. A position is the
        index of a predicted token: 1..len(token_ids). MissingCapabilityError on a model without
        the layer view (a server).
        """
        ids = _check_ids(token_ids, self.n_vocab)
        lens = require(self.backend, LayerLens, "the layer view")
        where = len(ids) if position is None else int(position)
        capture = lens.layer_capture(ids, [where], top_k=top_k)[0]
        return [list(layer.top) for layer in capture.layers]

    def steering_effect(self, token_ids: Sequence[int], position: int | None, steering: "Steering", *,
                        top_k: int = 10) -> "SteeringEffect":
        """The distribution predicting token `position` (default: the next token) with and without `steering`.

        Both full (V,) log-prob rows (`steered_logprobs`, `unsteered_logprobs`), KL(steered ‖ unsteered), the
        token's probability and rank both ways, the top risers and fallers (engine.steering.effect). One extra
        forward each way on a context of its own, on the model thread; MissingCapabilityError on a model that
        cannot steer.
        """
        from engine.steering.effect import steering_effect

        ids = _check_ids(token_ids, self.n_vocab)
        where = len(ids) if position is None else int(position)
        return self._executor.submit(
            lambda: steering_effect(self.backend, ids, where, steering, top_k=top_k, full=True)).result()

    # --- batch generation and beams ---------------------------------------------

    def generate(self, inputs: np.ndarray | Sequence[Sequence[int]], max_new_tokens: int = 32, do_sample: bool = False,
                 temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, stop: int | Sequence[int] | None = None,
                 seed: int | None = None, sampler: SamplerSettings | None = None) -> np.ndarray:
        """(batch, prompt_len + max_new_tokens) prompt and generated ids, -1 (`PAD`) where a cell holds no token.

        A row ends at the model's end-of-sequence tokens (kept) unless `stop` names other ids; `stop=()`
        runs every row to `max_new_tokens`. `sampler=SamplerSettings(...)` samples with every stage it sets,
        instead of `do_sample`/`temperature`/`top_k`/`top_p`. `generate_output` also gives each row's length;
        see `generate_batch`.
        """
        return self.generate_with_logprobs(inputs, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                           temperature=temperature, top_k=top_k, top_p=top_p, stop=stop, seed=seed,
                                           sampler=sampler)[0]

    def generate_output(self, inputs: np.ndarray | Sequence[Sequence[int]], **kwargs: Any) -> Generation:
        """`generate` as a `Generation`: the ids, the generated tokens' log-probs, and each row's length."""
        return Generation.from_arrays(*self.generate_with_logprobs(inputs, **kwargs))

    def generate_with_logprobs(self, inputs: np.ndarray | Sequence[Sequence[int]], **kwargs: Any
                               ) -> tuple[np.ndarray, np.ndarray]:  # kwargs: generate_batch's
        """`generate` plus the (batch, max_new_tokens) model logprobs of the generated tokens (NaN after a stop)."""
        for row in as_rows(inputs):
            check_token_ids(row, self.n_vocab)
        return generate_batch(self.runner, inputs, pad_id=self.runner.pad_id, context_length=self.context_length,
                              eos_token_ids=self.tokenizer.eos_token_ids, vocab=self.tokenizer, **kwargs)

    async def agenerate(self, inputs: np.ndarray | Sequence[Sequence[int]], **kwargs: Any) -> np.ndarray:
        """`generate` on the model thread; the event loop keeps running meanwhile."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: self.generate(inputs, **kwargs))

    def beam_search(self, prompt_ids: Sequence[int], *, num_beams: int = 4, max_new_tokens: int = 32,
                    length_penalty: float = 1.0, early_stopping: bool | str = False,
                    num_return_sequences: int = 1) -> list[BeamResult]:
        return beam_search(self.runner, _check_ids(prompt_ids, self.n_vocab), num_beams=num_beams, max_new_tokens=max_new_tokens,
                           length_penalty=length_penalty, early_stopping=early_stopping,
                           num_return_sequences=num_return_sequences,
                           eos_token_ids=sorted(self.tokenizer.eos_token_ids), pad_id=self.runner.pad_id,
                           context_length=self.context_length)

    def call(self, fn: Callable[[Any], _T]) -> Future[_T]:
        """`fn(backend)` on this model's thread, the one every forward runs on (as `Engine.call`); used by
        engine.experiments.model_diff to compare two models."""
        return self._executor.submit(fn, self.backend)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.runner.close()  # llama.cpp: its context goes before the model
        self.backend.close()

