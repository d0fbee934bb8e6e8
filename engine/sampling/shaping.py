"""The stateless stages llama.cpp and text-generation-webui added after the classic five.

Same shape as `engine.sampling.stages`: a factory takes the settings and
returns `fn(scores (V,) float32, ctx) -> (V,) float32`, -inf meaning
"removed". Each follows one reference implementation line by line in its
arithmetic (named in its docstring); the oracle tests run that reference on
the same numbers.

- `make_temperature_ext`: llama.cpp's `temp_ext` (temperature with a dynamic
  range chosen from the entropy).
- `make_top_n_sigma`: llama.cpp's `top_n_sigma`.
- `make_logit_bias`: llama.cpp's `logit_bias` (token ids; texts are turned
  into ids by the chain, which has the tokenizer).
- `make_smoothing`: text-generation-webui's quadratic sampling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from engine.sampling.stages import (
    NEG_INF,
    FilterStage,
    Stage,
    StageContext,
    exp_sums,
    finite_part,
    make_temperature,
)


_MIN_DYNAMIC_TEMPERATURE = np.float32(1e-6)


def make_temperature_ext(t: float, delta: float, exponent: float) -> Stage:
    """Temperature, made dynamic by `delta` (llama.cpp `llama_sampler_init_temp_ext`).

    With `delta` > 0 the temperature moves in [max(0, t - delta), t + delta]
    with the normalized entropy H / log(n) of the surviving n tokens: a sure
    model (low entropy) is sampled cooler, an unsure one hotter, mapped
    through `normalized ** exponent`. A temperature that comes out 0 keeps
    only the top token (llama.cpp's `temp <= 0` rule). With delta 0 this is
    the plain temperature stage.
    """
    if delta <= 0:
        return make_temperature(t)
    lo = max(np.float32(0.0), np.float32(t) - np.float32(delta))
    hi = np.float32(t) + np.float32(delta)
    exp32 = np.float32(exponent)

    def temperature(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        ids, vals = finite_part(scores)
        n = vals.size
        if n <= 1:
            return scores
        if n <= _EXACT_ENTROPY_MAX:
            normalized = _llamacpp_normalized_entropy(vals)
        else:
            m = vals.max()
            z, ed = exp_sums(vals, m, entropy=True, all_finite=True)
            normalized = np.float32(max(math.log(z) - ed / z, 0.0) / math.log(n))
        dyn = np.float32(lo + (hi - lo) * np.float32(normalized**exp32))
        # llama.cpp keeps only the (first) top token at a temperature <= 0; one so small that the logits would
        # overflow when divided by it (a tiny entropy to a large exponent) is that too.
        if dyn < _MIN_DYNAMIC_TEMPERATURE:
            out = np.full_like(scores, NEG_INF)
            best = int(np.argmax(scores))
            out[best] = scores[best]
            return out
        return scores / dyn

    return temperature


# Up to this many survivors the entropy is computed as llama.cpp computes it (float32 sums in descending
# order, which needs a sort: ~0.8 ms at 49k); beyond, exactly in float64 without a sort (a sort of 262k
# values costs ~5 ms). The two part by ~5e-5 relative in the temperature on a flat 49k-token row: that
# is the rounding of llama.cpp's float32 sums, which the temperature then magnifies.
_EXACT_ENTROPY_MAX = 1 << 16


def _llamacpp_normalized_entropy(vals: np.ndarray) -> np.float32:
    """H / log(n) with llama.cpp's float32 arithmetic and summation order (`llama_sampler_temp_ext_apply`)."""
    s = np.sort(vals)[::-1]
    p = np.exp(s - s[0])
    p /= np.cumsum(p, dtype=np.float32)[-1]  # np.cumsum adds one term after another, as llama.cpp's loop
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p), np.float32(0.0))
    entropy = -np.cumsum(terms, dtype=np.float32)[-1]
    max_entropy = -np.log(np.float32(1.0) / np.float32(s.size))
    return np.float32(entropy / max_entropy)


def make_top_n_sigma(n: float) -> Stage:
    """Top-nσ (Tang et al. 2024, "Top-nσ: Not All Logits Are You Need"; llama.cpp `top_n_sigma`).

    Keeps the tokens whose logit is within `n` standard deviations of the top
    logit, the mean and deviation taken over the finite logits. Works on
    logits, not probabilities, so it is unmoved by temperature. n <= 0 is off.
    """

    def top_n_sigma(scores: np.ndarray, ctx: StageContext) -> np.ndarray | None:
        _, vals = finite_part(scores)
        if vals.size <= 1:
            return None
        mean = float(vals.mean(dtype=np.float64))
        d = vals - np.float32(mean)  # (n,) float32
        std = math.sqrt(float(np.einsum("i,i->", d, d, dtype=np.float64)) / vals.size)
        cut = np.float32(float(vals.max()) - n * std)
        return scores >= cut

    return FilterStage(top_n_sigma, "top_n_sigma")


def make_logit_bias(token_ids: Sequence[int], biases: Sequence[float]) -> Stage:
    """Add `biases[i]` to the logit of `token_ids[i]` (llama.cpp `logit_bias`).

    An id may appear more than once (a text whose tokenization repeats a
    token): its biases add up, as in llama.cpp. A bias of -inf removes the
    token.
    """
    ids = np.asarray(token_ids, dtype=np.int64)
    bias = np.asarray(biases, dtype=np.float32)

    def logit_bias(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        if ids.size and np.max(ids) >= scores.size:
            raise ValueError(
                f"logit_bias names token {int(np.max(ids))}, but this model's vocabulary has {scores.size} tokens"
            )
        out = scores.copy()
        np.add.at(out, ids, bias)
        return out

    return logit_bias


def make_smoothing(factor: float, curve: float) -> Stage:
    """Quadratic sampling ("smoothing"), from text-generation-webui.

    The formula is `QuadraticSamplingLogitsWarper` in text-generation-webui's
    `modules/sampler_hijack.py` (oobabooga, PR #5403 and the smoothing_curve
    follow-up)::

        diff = logit - max_logit
        k = (3 - curve) / 2;  s = (curve - 1) / 2
        logit' = -(k * factor * diff**2) + (s * factor * diff**3) + max_logit

    applied to finite logits only. The top token keeps its logit; the others
    fall with the square of their distance to it, so a small factor flattens
    the near candidates (the parabola is flat at the top) and cuts the far
    tail hard. curve 1 is the plain quadratic; a larger curve adds the cubic
    term that punishes the tail more. factor 0 is off.
    """
    k = np.float32((3.0 - curve) / 2.0 * factor)
    s = np.float32((curve - 1.0) / 2.0 * factor)

    def smoothing(scores: np.ndarray, ctx: StageContext) -> np.ndarray:
        m = scores.max()
        with np.errstate(invalid="ignore"):  # -inf entries: (-inf)**2 * k - ... is NaN, masked below
            diff = scores - m
            out = -(k * diff * diff) + s * diff * diff * diff + m
        if not np.isfinite(scores).all():
            out = np.where(scores > NEG_INF, out, NEG_INF)
        return out.astype(np.float32, copy=False)

    return smoothing
