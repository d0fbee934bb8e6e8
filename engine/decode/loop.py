"""The decode loop: a generator that prefills, then yields one `TokenEvent` per token and a final `Done`.

Shape follows mlx-lm's `generate_step` / `stream_generate` split: this loop
runs the model (prefill, one forward per token, the overlap below) and the
per-token bookkeeping -- history, detokenizer, stop strings, end of
sequence, banned-string step-backs, the constraint, the record the stats
come from -- is one `AnswerRow` (engine/decode/row.py), the same object the
loom's batched rows use. Step mode and step-backs are helpers around the
loop. The caller pulls events; cancellation is a `threading.Event` checked
before every forward, so a cancel takes effect before the next token. Only
small Python values are yielded.

Per token the sampler chooses first (`SamplerChain.choose`), and the token's
report (stage snapshots, top-N, entropy) is built after. On a backend that
can (`OverlappedForward`: llama.cpp, MLX, torch) the report is built while the
model computes the next token, as mlx-lm overlaps its bookkeeping with
`mx.async_eval`; a token's event then comes out once the next forward has
run, so a cancel seen on that event takes effect one token later. Where the
backend keeps its rows on an accelerator (`SamplesOnDevice`: torch on CUDA),
the rows stay there and the chain runs there (`AnswerRow.device`); only the
token and its report cross to the host.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np

from engine.backend import Backend, prefill
from engine.capabilities import OverlappedForward, RecordsCacheSchedule
from engine.decode.row import MAX_REWINDS, AnswerRow, Taken, token_event
from engine.errors import ContextLengthError
from engine.events import Done, Event, TokenEvent
from engine.request import GenerationRequest
from engine.steering.apply import steer_for_request
from engine.sampling import Choice, Pick
from engine.sampling.torch_chain import TorchChoice
from engine.tokenizer import TokenizerLike, check_token_ids, vocabulary_size
from engine.tools.request_tools import prompt_ids_with_tools

__all__ = ["MAX_REWINDS", "Chooser", "check_context", "generate_events", "prompt_ids_for", "token_event"]

# Step mode: shown a sampled token's event, returns the token to take instead (None: the sampler's pick).
Chooser = Callable[[TokenEvent], "int | None"]
# A backend's forward that runs `work` while it computes (OverlappedForward.forward_during).
Overlap = Callable[..., tuple[Any, TokenEvent]]


def prompt_ids_for(tokenizer: TokenizerLike, request: GenerationRequest, n_vocab: int = 0) -> list[int]:
    """The full token sequence the model continues, assistant prefix included.

    Every id the request brings (prompt ids, the answer's prefix, forced tokens: from a file, the API or a
    branch) is checked against the vocabulary here, before any of them reaches the model or the detokenizer.
    """
    n_vocab = vocabulary_size(tokenizer) or n_vocab  # `n_vocab`: the model's logits, when the tokenizer cannot say
    check_token_ids(request.assistant_prefix, n_vocab, "answer token id")
    check_token_ids(request.forced_tokens, n_vocab, "forced token id")
    if request.prompt_ids is not None:
        check_token_ids(request.prompt_ids, n_vocab, "prompt token id")
        ids = list(request.prompt_ids)
    elif request.messages is not None:
        # A chat with tools (or calls and results in its history) renders through engine.tools.
        ids = prompt_ids_with_tools(tokenizer, request) or tokenizer.chat_ids(request.messages, add_generation_prompt=True)
    else:
        assert request.prompt is not None
        ids = tokenizer.encode(request.prompt)
    return ids + list(request.assistant_prefix)


def check_context(prompt_len: int, max_new_tokens: int, context_length: int) -> None:
    if context_length and prompt_len + max_new_tokens > context_length:
        raise ContextLengthError(
            f"the prompt has {prompt_len} tokens and {max_new_tokens} new tokens were asked for, "
            f"{prompt_len + max_new_tokens} in all, but the model's context length is {context_length}"
        )


def generate_events(
    backend: Backend,
    request: GenerationRequest,
    cancel: threading.Event | None = None,
    *,
    recoverable: tuple[type[Exception], ...] = (),
    choose: Chooser | None = None,
) -> Generator[Event, None, None]:
    """Run one generation on `backend`; yields TokenEvents then exactly one Done.

    `choose` (step mode): called with each sampled token's event before it is taken (its text not yet
    released); it returns the token to take instead, or None for the sampler's pick. It may block while a
    user decides; when `cancel` is set by the time it returns, the run ends as cancelled without that token.

    `recoverable`: failures of `backend.forward` that end the answer instead of losing it (a server that
    dies mid-answer). After the first token such a failure ends the run with finish reason "error", its
    message in `stats.error`, and the tokens, seed and timings so far; raised during the prompt, or while
    `cancel` is set, it ends the run as cancelled when cancelled and is re-raised otherwise.
    """
    cancel = cancel or threading.Event()
    t0 = time.perf_counter()
    prompt = prompt_ids_for(backend.tokenizer, request, int(getattr(backend.info, "vocab_size", 0) or 0))
    check_context(len(prompt), request.max_new_tokens, backend.info.context_length)
    steer_for_request(backend, request.steering)  # applied, or refused in words, before any forward
    # (the constraint's matcher is made here, before any forward)
    row = AnswerRow.start(backend, request, prompt, t0, on_device=True)
    # Where the backend can, the next forward runs while this token's report is built (`forward_during`).
    # Rows sampled on the backend's device come from its device forwards (SamplesOnDevice), left there.
    forward: Callable[[Sequence[int]], Any] = backend.forward
    overlap: Overlap | None = backend.forward_during if isinstance(backend, OverlappedForward) else None
    if row.device is not None:
        forward, overlap = row.device.forward, row.device.forward_during if overlap is not None else None
    reused = 0

    try:
        logits, reused = prefill(backend, prompt, cancelled=cancel.is_set, schedule=request.cache_schedule)
    except recoverable:
        if not cancel.is_set():
            raise  # nothing generated yet: the caller's error to report
        logits = None
    if logits is None or cancel.is_set():
        row.end("cancelled")
        logits = None
    # How the prompt's cache was computed (the forward calls), recorded for an exact replay where the backend says.
    schedule = backend.cache_schedule(len(prompt)) if isinstance(backend, RecordsCacheSchedule) else ()
    while logits is not None and row.room_left:
        chosen = _choose(backend, row, logits, choose, cancel)
        taken = row.take(chosen[0], logits, chosen[1]) if chosen is not None else None
        if taken is None:
            break  # cancelled while the person chose, or the constraint refused the token
        if taken.step_back is not None:  # a banned string completed: on from the tokens kept
            logits = _step_back(backend, row, taken.step_back, cancel, recoverable)
            continue
        if taken.ends or cancel.is_set():
            yield row.event(taken)
            if not taken.ends:
                row.end("cancelled")
            break
        logits = yield from _next_logits(forward, overlap, row, taken, cancel, recoverable)
    yield Done(row.stats(reused_tokens=reused, peak_memory_bytes=backend.peak_memory_bytes(), cache_schedule=schedule))


def _choose(
    backend: Backend, row: AnswerRow, logits: Any, choose: Chooser | None, cancel: threading.Event
) -> tuple[Choice | TorchChoice, Pick | None] | None:
    """This position's token, and its report when step mode built it; None: cancelled while the person chose.

    The token first (the next forward waits for it); its report when it is shown. In step mode the person
    is shown the sampler's pick and may take another token: the stages' state is put back to before the
    pick and the person's token is chosen instead, fully reported.
    """
    forced = row.forced_here()
    if choose is None or forced is not None:
        return row.choose(logits, forced), None
    before = row.chain.state()
    choice = row.choose(logits)
    pick = choice.report(row.request.top_n)
    asked = time.perf_counter()
    chosen = choose(row.preview(pick))
    row.record.waited(time.perf_counter() - asked)  # the person's time, not the model's: kept out of the speeds
    if chosen is not None:
        check_token_ids([chosen], vocabulary_size(row.tok) or backend.info.vocab_size, "chosen token id")
    if cancel.is_set():
        row.end("cancelled")
        return None
    if chosen is not None and chosen != pick.token_id:
        return row.choose_instead(logits, int(chosen), before), None
    return choice, pick


def _step_back(
    backend: Backend, row: AnswerRow, ids: list[int], cancel: threading.Event,
    recoverable: tuple[type[Exception], ...],
) -> np.ndarray | None:
    """The logits after `ids` (the prompt and the tokens kept); None when the row ended (cancelled, failed)."""
    if cancel.is_set():
        row.end("cancelled")
        return None
    try:  # trims the cache to prompt + kept tokens and recomputes the last one's logits
        logits, _ = prefill(backend, ids, cancelled=cancel.is_set)
    except recoverable as e:
        row.end(*(("cancelled", None) if cancel.is_set() else ("error", str(e))))
        return None
    if logits is None:
        row.end("cancelled")
    return logits


def _next_logits(
    forward: Callable[[Sequence[int]], Any], overlap: Overlap | None, row: AnswerRow, taken: Taken,
    cancel: threading.Event, recoverable: tuple[type[Exception], ...],
) -> Generator[Event, None, Any]:
    """Yields `taken`'s event and returns the next forward's logits (None: the row ended).

    Without overlap the event comes first, then the forward. With it, the event is built while the model
    computes the next token, so a Stop pressed on seeing this event costs one forward more (the cache keeps
    its token).
    """
    if overlap is None:
        yield row.event(taken)
        if cancel.is_set():
            row.end("cancelled")
            return None
    try:
        if overlap is None:
            return forward([taken.token_id])
        logits, shown = overlap([taken.token_id], lambda: row.event(taken))
    except recoverable as e:
        if overlap is not None:
            yield row.event(taken)  # the token is good; only the forward after it failed
        row.end(*(("cancelled", None) if cancel.is_set() else ("error", str(e))))
        return None
    yield shown
    if cancel.is_set():
        row.end("cancelled")
        return None
    return logits
