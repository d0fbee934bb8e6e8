"""The decode loop: a generator that prefills, then yields one `TokenEvent` per token and a final `Done`.

Shape follows mlx-lm's `generate_step`: the caller pulls events; cancellation
is a `threading.Event` checked before every forward, so a cancel takes effect
before the next token. Only small Python values are yielded.

Per token the sampler chooses first (`SamplerChain.choose`), and the token's
report (stage snapshots, top-N, entropy) is built after. On a backend that
can (`OverlappedForward`: llama.cpp, MLX) the report is built while the
model computes the next token, as mlx-lm overlaps its bookkeeping with
`mx.async_eval`; a token's event then comes out once the next forward has
run, so a cancel seen on that event takes effect one token later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from engine.backends.base import Backend, prefill
from engine.banned_strings import BannedStringGuard
from engine.capabilities import OverlappedForward
from engine.errors import ContextLengthError
from engine.events import Done, Event, GenerationStats, Rewind, StageSnapshot, TokenEvent
from engine.request import GenerationRequest
from engine.steering.apply import steer_for_request
from engine.sampling import Pick, SamplerChain
from engine.sampling.grammar import constraint_step, grammar_stage
from engine.stopping import StopStringMatcher
from engine.top_n import reported_view
from engine.tokenizer import StreamDetokenizer, Tokenizer, check_token_ids, partial_token_bytes, vocabulary_size

# Step mode: shown a sampled token's event, returns the token to take instead (None: the sampler's pick).
Chooser = Callable[[TokenEvent], "int | None"]

log = logging.getLogger(__name__)

# At most this many step-backs for banned strings per answer (each costs one forward); past it, a banned
# phrase stays in the text with a warning in the log.
MAX_REWINDS = 256


def prompt_ids_for(tokenizer: Tokenizer, request: GenerationRequest, n_vocab: int = 0) -> list[int]:
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
        ids = tokenizer.chat_ids(request.messages, add_generation_prompt=True)
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
) -> Iterator[Event]:
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
    tok = backend.tokenizer
    t0 = time.perf_counter()
    prompt = prompt_ids_for(tok, request, int(getattr(backend.info, "vocab_size", 0) or 0))
    check_context(len(prompt), request.max_new_tokens, backend.info.context_length)
    steer_for_request(backend, request.steering)  # applied, or refused in words, before any forward
    grammar = grammar_stage(request.constraint, tok, backend.info)  # this run's matcher; before any forward
    chain = SamplerChain(request.sampler, vocab=tok, constraint=grammar)

    # Penalties look at prompt + generated tokens; a preallocated buffer avoids O(n^2) appends.
    history = np.empty(len(prompt) + request.max_new_tokens, dtype=np.int64)
    history[: len(prompt)] = prompt
    n_hist = len(prompt)

    detok = StreamDetokenizer(tok, context_ids=prompt)
    stopper = StopStringMatcher(request.stop)
    generated: list[int] = []
    finish = "length"
    error: str | None = None
    t_first = t_last = None
    reused = 0
    # Step mode: time spent waiting for the person to choose is not the model's: kept out of the speeds.
    waited_first = waited_after = 0.0

    def done() -> Done:
        now = time.perf_counter()
        decode_s = (t_last - t_first - waited_after) if (t_first is not None and t_last is not None) else 0.0
        return Done(
            GenerationStats(
                finish_reason=finish,
                prompt_tokens=len(prompt),
                reused_tokens=reused,
                generated_tokens=len(generated),
                time_to_first_token_s=(t_first - t0 - waited_first) if t_first is not None else 0.0,
                decode_tokens_per_s=(len(generated) - 1) / decode_s if decode_s > 0 else 0.0,
                total_s=now - t0,
                peak_memory_bytes=backend.peak_memory_bytes(),
                seed=chain.seed,
                text=stopper.text,
                token_ids=tuple(generated),
                error=error,
                constraint_logprob=grammar.run.log_mass_kept if grammar is not None else None,
                constraint_status=grammar.run.finish_note(finish) if grammar is not None else "",
            )
        )

    reported_n = backend.info.reports_top_n  # a server's top N: the model view is what it reported (engine/top_n.py)

    def shown(event: TokenEvent, row: np.ndarray) -> TokenEvent:
        if grammar is not None:
            event = constraint_step(event, grammar, tok)
        return reported_view(event, row, reported_n) if reported_n else event  # `row`: this step's logits

    # Where the backend can, the next forward runs while this token's report is built (`forward_during`).
    overlap = backend.forward_during if isinstance(backend, OverlappedForward) else None

    try:
        logits, reused = prefill(backend, prompt, cancelled=cancel.is_set)
    except recoverable:
        if not cancel.is_set():
            raise  # nothing generated yet: the caller's error to report
        logits = None
    if logits is None or cancel.is_set():
        finish = "cancelled"
        yield done()
        return

    # Banned strings: text that may still become a banned phrase is held back; when one completes, the loop
    # steps back to the token it began with (engine/banned_strings.py). The stage state before each held
    # token's pick is kept so a step back restarts mirostat / adaptive-p from where they were.
    guard = BannedStringGuard(request.sampler.banned_strings)
    bans: dict[int, set[int]] = {}  # position among generated tokens -> tokens banned there
    states: dict[int, tuple] = {}
    rewind: Rewind | None = None  # told with the next token event
    rewinds_left = MAX_REWINDS

    while len(generated) < request.max_new_tokens:
        step = len(generated)
        forced = request.forced_tokens[step] if step < len(request.forced_tokens) else None
        if guard.active:
            states[step] = chain.state()
        before = chain.state() if choose is not None else ()
        # The token first (the next forward waits for it); its report (`choice.report`) when it is shown.
        choice = chain.choose(
            logits,
            history[:n_hist],
            record_stages=request.record_stages,
            force_token=forced,
            banned=bans.get(step, ()),
        )
        pick: Pick | None = None
        if choose is not None and forced is None:
            pick = choice.report(request.top_n)
            asked = time.perf_counter()
            chosen = choose(_event(tok, step, pick, ""))
            if t_first is None:
                waited_first += time.perf_counter() - asked
            else:
                waited_after += time.perf_counter() - asked
            if chosen is not None:
                check_token_ids([chosen], vocabulary_size(tok) or backend.info.vocab_size, "chosen token id")
            if cancel.is_set():
                finish = "cancelled"
                break
            if chosen is not None and chosen != pick.token_id:
                chain.restore(before)  # the stages' state as before this pick; then the user's token, fully reported
                choice = chain.choose(logits, history[:n_hist], record_stages=request.record_stages,
                                      force_token=int(chosen), banned=bans.get(step, ()))
                pick = None

        def event(text: str, special: bool = False, *, choice=choice, pick=pick, rewind=rewind, row=logits,
                  step=step) -> TokenEvent:
            """This token's event, its report built now (step mode has it already)."""
            return shown(_event(tok, step, pick or choice.report(request.top_n), text, special, rewind), row)

        if grammar is not None and grammar.run.failure:  # a dead end, or a token the constraint refuses
            finish, error = "error", grammar.run.failure
            break
        t_last = time.perf_counter()
        if t_first is None:
            t_first = t_last
        token = choice.token_id
        generated.append(token)
        history[n_hist] = token
        n_hist += 1

        if token in tok.eos_token_ids and not request.ignore_eos:
            finish = "eos"
            released, _ = stopper.feed(guard.finish(detok.flush()))
            yield event(released + stopper.flush(), special=True)
            break
        released, ban = guard.feed(step, detok.add(token))
        if ban is not None:
            if ban.start < len(request.forced_tokens) or rewinds_left == 0:
                # A forced token cannot be banned, and a model that keeps coming back to its phrases is let be.
                log.warning("banned string %r left in the answer (%s)", ban.phrase,
                            "it began with a forced token" if rewinds_left else f"{MAX_REWINDS} step-backs already")
                released = guard.give_up()
            else:
                rewinds_left -= 1
                i = ban.start
                withdrawn = generated[i:]
                bans = {k: v for k, v in bans.items() if k <= i}  # later bans belonged to the abandoned text
                bans.setdefault(i, set()).add(withdrawn[0])
                rewind = Rewind(ban.phrase, len(withdrawn), withdrawn[0], tok.token_text(withdrawn[0]))
                del generated[i:]
                n_hist = len(prompt) + i
                chain.restore(states[i])
                guard.rewind(i)
                detok = StreamDetokenizer(tok, context_ids=prompt + generated)
                if cancel.is_set():
                    finish = "cancelled"
                    break
                try:  # trims the cache to prompt + kept tokens and recomputes the last one's logits
                    logits, _ = prefill(backend, prompt + generated, cancelled=cancel.is_set)
                except recoverable as e:
                    finish, error = ("cancelled", None) if cancel.is_set() else ("error", str(e))
                    break
                if logits is None:
                    finish = "cancelled"
                    break
                continue
        for k in [k for k in states if k < guard.held_from]:
            del states[k]
        released, stopped = stopper.feed(released)
        last = len(generated) == request.max_new_tokens
        if stopped:
            finish = "stop"
        elif last:
            released += stopper.feed(guard.finish(detok.flush()))[0] + stopper.flush()
        rewind = None
        if stopped or last or cancel.is_set():
            yield event(released)
            if not (stopped or last):
                finish = "cancelled"
            break
        if overlap is None:
            yield event(released)
            if cancel.is_set():
                finish = "cancelled"
                break
        try:
            if overlap is None:
                logits = backend.forward([token])
            else:
                # This token's report is built while the model computes the next one. A Stop pressed on
                # seeing this event then costs one forward more (the cache keeps its token).
                logits, shown_event = overlap([token], lambda text=released: event(text))
        except recoverable as e:
            if overlap is not None:
                yield event(released)  # the token is good; only the forward after it failed
            if cancel.is_set():
                finish = "cancelled"
            else:
                finish, error = "error", str(e)
            break
        if overlap is not None:
            yield shown_event
            if cancel.is_set():
                finish = "cancelled"
                break
    yield done()


def _event(
    tok: Tokenizer,
    index: int,
    pick: Pick,
    text: str,
    special: bool = False,
    rewind: Rewind | None = None,
) -> TokenEvent:
    # The pick's alternatives are TokenProb already (named by the chain with this tokenizer).
    stages = None
    if pick.stages is not None:
        stages = tuple(
            StageSnapshot(s.name, s.survivors, s.mass_kept, s.entropy, s.top, removed=s.removed) for s in pick.stages
        )
    token_text = tok.token_text(pick.token_id)
    return TokenEvent(
        index=index,
        token_id=pick.token_id,
        text=text,
        token_text=token_text,
        logprob=pick.logprob,
        sampler_logprob=pick.sampler_logprob,
        rank=pick.rank,
        entropy=pick.entropy,
        top_model=pick.top_model,
        top_sampler=pick.top_sampler,
        stages=stages,
        forced=pick.forced,
        special=special,
        token_bytes=partial_token_bytes(tok, pick.token_id, token_text),
        rewind=rewind,
    )
