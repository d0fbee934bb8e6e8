"""How one answer went, kept while it runs and said once at its end: `AnswerRecord` and `generation_stats`.

Every way an answer is made (the decode loop, the loom's batched rows, a
server's stream) keeps the same record: the tokens taken, when the first and
the last were taken, time spent waiting for a person (step mode), and how it
ended. `generation_stats` is the one place a `GenerationStats` is built, so
the speeds mean the same thing whichever path made the answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.events import FinishReason, GenerationStats


def generation_stats(
    *,
    finish: FinishReason,
    prompt_tokens: int,
    token_ids: tuple[int, ...] = (),
    text: str = "",
    seed: int,
    t0: float | None = None,
    t_first: float | None = None,
    t_last: float | None = None,
    now: float | None = None,
    reused_tokens: int = 0,
    peak_memory_bytes: int = 0,
    waited_first_s: float = 0.0,
    waited_after_s: float = 0.0,
    error: str | None = None,
    constraint_logprob: float | None = None,
    constraint_status: str = "",
) -> GenerationStats:
    """The stats of one answer: the only constructor of `GenerationStats` in the engine's decode paths.

    Args:
        t0: when the answer was asked for (None: it never started; every time is then 0).
        t_first, t_last: when its first and last tokens were taken (None: no token).
        now: its end (default: now).
        waited_first_s, waited_after_s: time spent waiting for a person before the first token and after it
            (step mode): not the model's, so kept out of the time to first token and the decode speed.
    """
    n = len(token_ids)
    decode_s = (t_last - t_first - waited_after_s) if t_first is not None and t_last is not None else 0.0
    if t0 is None:
        ttft = total = 0.0
    else:
        ttft = (t_first - t0 - waited_first_s) if t_first is not None else 0.0
        total = (time.perf_counter() if now is None else now) - t0
    return GenerationStats(
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        reused_tokens=reused_tokens,
        generated_tokens=n,
        time_to_first_token_s=ttft,
        decode_tokens_per_s=(n - 1) / decode_s if decode_s > 0 else 0.0,
        total_s=total,
        peak_memory_bytes=peak_memory_bytes,
        seed=seed,
        text=text,
        token_ids=tuple(token_ids),
        error=error,
        constraint_logprob=constraint_logprob,
        constraint_status=constraint_status,
    )


@dataclass(slots=True)
class AnswerRecord:
    """One answer's tokens, times and end while it runs (whoever decides its tokens).

    Attributes:
        t0: when the answer was asked for.
        token_ids: the tokens taken so far (a step back removes some: `drop_from`).
        finish: how it ended, "length" until something else ends it.
        error: the failure's message when `finish` is "error".
    """

    t0: float
    token_ids: list[int] = field(default_factory=list)
    finish: FinishReason = "length"
    error: str | None = None
    t_first: float | None = None
    t_last: float | None = None
    waited_first_s: float = 0.0
    waited_after_s: float = 0.0

    def took(self, token_id: int) -> None:
        """A token was taken now."""
        self.t_last = time.perf_counter()
        if self.t_first is None:
            self.t_first = self.t_last
        self.token_ids.append(token_id)

    def waited(self, seconds: float) -> None:
        """A person was asked to choose (step mode) for `seconds`: kept out of the model's times."""
        if self.t_first is None:
            self.waited_first_s += seconds
        else:
            self.waited_after_s += seconds

    def drop_from(self, index: int) -> list[int]:
        """Take back the tokens from `index` on (a step back); returns them."""
        withdrawn = self.token_ids[index:]
        del self.token_ids[index:]
        return withdrawn

    def end(self, finish: FinishReason, error: str | None = None) -> None:
        self.finish, self.error = finish, error

    def stats(
        self,
        *,
        prompt_tokens: int,
        text: str,
        seed: int,
        now: float | None = None,
        reused_tokens: int = 0,
        peak_memory_bytes: int = 0,
        error: str | None = None,
        constraint_logprob: float | None = None,
        constraint_status: str = "",
    ) -> GenerationStats:
        """This answer's `GenerationStats` (`error`: said instead of the record's own, e.g. an empty answer's why)."""
        return generation_stats(
            finish=self.finish, prompt_tokens=prompt_tokens, token_ids=tuple(self.token_ids), text=text, seed=seed,
            t0=self.t0, t_first=self.t_first, t_last=self.t_last, now=now, reused_tokens=reused_tokens,
            peak_memory_bytes=peak_memory_bytes, waited_first_s=self.waited_first_s,
            waited_after_s=self.waited_after_s, error=error if error is not None else self.error,
            constraint_logprob=constraint_logprob, constraint_status=constraint_status,
        )
