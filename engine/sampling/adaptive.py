"""Stages with per-run state: mirostat 1 and 2, and adaptive-p.

Each steers how much of the distribution it keeps by feedback from the
tokens already picked, so it carries state from step to step: mirostat its
`mu` (the largest surprise, in bits, it lets through), adaptive-p a moving
average of the picked tokens' probabilities. That state lives in these small
objects, and the chain owns them (one chain per run): never the settings.
A replay with the same seed starts from the same state and gives the same
tokens.

Each object is a stage (`__call__(scores, ctx) -> scores`) plus
`accept(token)`, which the chain calls with the token it picked, and
`state()` / `restore(state)`, which the decode loop uses to step back (a
banned string's rewind). In llama.cpp these samplers also *draw* the token;
here the chain draws from the final distribution as for every other stage,
so what they do is visible as a stage: a truncation (mirostat) or a
reshaping (adaptive-p) of the distribution. Their arithmetic follows
llama.cpp's `llama-sampler.cpp` (0.3.36), which the oracle tests run.
"""

from __future__ import annotations

import math

import numpy as np

from engine.sampling.stages import NEG_INF, StageContext, exp_sums, finite_part, keep_only

_LN2 = math.log(2.0)


class _Remembers:
    """Keeps the stage's last output, so `accept` can look up the picked token's probability in it."""

    def __init__(self) -> None:
        self._out: np.ndarray | None = None
        self._lse = 0.0

    def _remember(self, out: np.ndarray) -> np.ndarray:
        m = out.max()
        self._out, self._lse = out, float(m) + math.log(exp_sums(out, m)[0])
        return out

    def _picked_prob(self, token: int) -> float:
        if self._out is None or not 0 <= token < self._out.size:
            return 0.0
        s = float(self._out[token])
        return math.exp(s - self._lse) if s != -math.inf else 0.0


class Mirostat(_Remembers):
    """Mirostat 1 (Basu et al. 2021, arXiv:2007.14966; llama.cpp `llama_sampler_init_mirostat`, m = 100).

    Estimates the Zipf exponent s of the distribution from its top m tokens,
    derives the k for which top-k sampling would give a surprise of `mu`
    bits, and keeps the top k. After each pick, `mu -= eta * (surprise - tau)`
    with the picked token's surprise under the kept distribution, so the
    text's surprise settles at `tau`.
    """

    def __init__(self, tau: float, eta: float, m: int = 100) -> None:
        super().__init__()
        self.tau, self.eta, self.m = tau, eta, m
        self.mu = np.float32(2.0 * tau)

    def __call__(self, scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        _, vals = finite_part(scores)
        if vals.size <= 1:
            return self._remember(scores)
        n_top = min(self.m, vals.size)
        top = np.sort(np.partition(vals, vals.size - n_top)[vals.size - n_top :])[::-1].astype(np.float64)
        i = np.arange(n_top - 1, dtype=np.float64)
        t = np.log((i + 2) / (i + 1))
        b = top[:-1] - top[1:]  # log(p_i / p_(i+1))
        s_hat = float((t * b).sum() / (t * t).sum())
        eps = s_hat - 1.0
        v = scores.size  # llama.cpp uses the vocabulary size here, not the survivors
        with np.errstate(all="ignore"):
            k = (eps * 2.0 ** float(self.mu) / (1.0 - v ** (-eps))) ** (1.0 / s_hat)
        k_int = max(int(k), 1) if math.isfinite(k) and k < v else v
        if k_int >= vals.size:
            return self._remember(scores)
        kth = np.partition(vals, vals.size - k_int)[vals.size - k_int]
        return self._remember(keep_only(scores, scores >= kth))

    def accept(self, token: int) -> None:
        p = self._picked_prob(token)
        if p > 0:  # a forced token the stage had cut says nothing about its target
            self.mu = np.float32(self.mu - self.eta * (-math.log2(p) - self.tau))

    def state(self) -> float:
        return float(self.mu)

    def restore(self, state: float) -> None:
        self.mu = np.float32(state)


class Mirostat2(Mirostat):
    """Mirostat 2 (llama.cpp `llama_sampler_init_mirostat_v2`): keep the tokens whose surprise,
    -log2 p, is at most `mu` (at least the top one); `mu` learns as in mirostat 1."""

    def __call__(self, scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        m = scores.max()
        lse = float(m) + math.log(exp_sums(scores, m)[0])
        # -log2(p) <= mu  <=>  s - lse >= -mu * ln 2; the top token always survives.
        cut = np.float32(min(lse - float(self.mu) * _LN2, float(m)))
        return self._remember(keep_only(scores, scores >= cut))


# llama.cpp's adaptive-p constants (llama-sampler.cpp).
_WIDTH = np.float32(0.3)
_INV_WIDTH = np.float32(1.0) / _WIDTH
_EXACT_SUM_MAX = 1 << 16
_PEAK = np.float32(5.0)
_SHARPNESS = np.float32(10.0)


class AdaptiveP:
    """Adaptive-p (llama.cpp PR #17927, `llama_sampler_init_adaptive_p`).

    Reshapes the distribution to favour tokens whose probability is near a
    target: each surviving token's new logit is
    `5 - 10 * d**2 / (1 + d)` with `d = |p - target'| / 0.3`, where `p` is
    its probability entering the stage and `target'` is the target corrected
    by an exponential moving average of the picked tokens' probabilities
    (`2 * target - average`), so over time the picks average `target`.
    """

    def __init__(self, target: float, decay: float) -> None:
        self.target, self.decay = target, decay
        self.weighted_sum = np.float32(target / (1.0 - decay))
        self.total_weight = np.float32(1.0 / (1.0 - decay))
        self._ids: np.ndarray | None = None
        self._probs: np.ndarray | None = None

    def __call__(self, scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        ids, vals = finite_part(scores)
        m = vals.max()
        probs = np.subtract(vals, m)
        np.exp(probs, out=probs)
        # llama.cpp's softmax adds the float32 terms one after the other in array (token id) order, and the
        # transform below magnifies its rounding (up to 5e-5 in the result on a flat 49k row): up to 64k
        # survivors do exactly the same (cumsum is sequential); beyond, its ~0.9 ms at 262k is over the
        # budget, and an exact float64 sum is used.
        if probs.size <= _EXACT_SUM_MAX:
            probs /= np.cumsum(probs, dtype=np.float32)[-1]
        else:
            probs /= np.float32(probs.sum(dtype=np.float64))
        self._ids, self._probs = ids, probs
        target = min(max(self.target, 0.0), 1.0)
        adapted = np.float32(min(max(2.0 * target - float(self.weighted_sum) / float(self.total_weight), 0.0), 1.0))
        # new = 5 - 10 * d**2 / (1 + d), d = |p - target'| / 0.3, in place (the same float32 operations)
        d = np.subtract(probs, adapted)
        d *= _INV_WIDTH
        np.abs(d, out=d)
        den = d + np.float32(1.0)
        new = np.multiply(d, _SHARPNESS)  # ((10 * d) * d) / (1 + d): llama.cpp's order of operations
        new *= d
        new /= den
        np.subtract(_PEAK, new, out=new)
        if ids is None:
            return new
        out = np.full_like(scores, NEG_INF)
        out[ids] = new
        return out

    def accept(self, token: int) -> None:
        """Fold the picked token's probability *entering* the stage into the moving average."""
        p = 0.0
        if self._probs is not None:
            if self._ids is None:
                p = float(self._probs[token]) if 0 <= token < self._probs.size else 0.0
            else:
                j = int(np.searchsorted(self._ids, token))
                p = float(self._probs[j]) if j < self._ids.size and self._ids[j] == token else 0.0
        decay = np.float32(self.decay)  # float32 arithmetic, as llama.cpp
        self.weighted_sum = np.float32(p) + decay * self.weighted_sum
        self.total_weight = np.float32(1.0) + decay * self.total_weight
        self._ids = self._probs = None

    def state(self) -> tuple[float, float]:
        return float(self.weighted_sum), float(self.total_weight)

    def restore(self, state: tuple[float, float]) -> None:
        self.weighted_sum, self.total_weight = np.float32(state[0]), np.float32(state[1])
