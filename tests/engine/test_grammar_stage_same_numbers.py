"""The `grammar` stage made cheaper per token (issue 45) reports the very same numbers and picks the same tokens.

Constrained answers on the default model (SmolLM2 on llama.cpp): a JSON schema sampled at temperature 0.7, a
required tool call, and an auto answer with tools (text or a call: the grammar then bans only a few dozen
tokens, the stage's cheap path). Each runs with the stage as it is and again with the stage as it was before
(the old functions are copied below as the reference); every step's GrammarStep (allowed, mass_kept,
disallowed, forced, note), every row the stage returns (byte for byte) and every token's id and log-probs
must be equal, float for float. What it saves per token is measured, not asserted: `python bench/grammar_stage.py`
times this stage against the reference below (docs/tools.md, "Measured").
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.constraints import Constraint
from engine.decode.loop import generate_events
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling import grammar as G
from engine.sampling.grammar import GrammarStep
from engine.sampling.settings import SamplerSettings
from engine.sampling.stages import NEG_INF, keep_only

pytest.importorskip("llguidance")


# --- the reference: engine/sampling/grammar.py's stage before issue 45, verbatim -------------------------------

def _old_call(self, scores, ctx):
    run = self.run
    forced = run.fast_forward()
    if forced is not None and forced < scores.size and scores[forced] > NEG_INF:
        keep = np.zeros(scores.size, dtype=np.bool_)
        keep[forced] = True
        note = "fast-forward: the grammar forces this token"
    else:
        keep = run.allowed(scores)
        note = ""
    live = keep & (scores > NEG_INF)
    n = int(np.count_nonzero(live))
    top = float(scores.max())
    w = np.exp(scores - np.float32(top))
    z = float(w.sum(dtype=np.float64))
    lse = top + math.log(z)
    if n == 0:
        run.fail(self.dead_end_reason(keep))
        self.last = GrammarStep(0, 0.0, _old_top_removed(scores, live, top, lse), False, run.note)
        return scores
    mass = min(max(float(w.sum(dtype=np.float64, where=live)) / z, 0.0), 1.0)
    run.record(math.log(mass) if mass > 0 else -math.inf)
    if n == 1 and not note:
        note = "the only token the grammar allows"
    notes = "; ".join(x for x in (note, run.note) if x)
    self.last = GrammarStep(n, mass, _old_top_removed(scores, live, top, lse), n == 1, notes)
    return keep_only(scores, live)


def _old_top_removed(scores, live, top, lse, n=G.TOP_DISALLOWED):
    removed = ~live & (scores > NEG_INF)
    count = int(np.count_nonzero(removed))
    if count == 0:
        return ()
    want = min(n, count)
    cand = None
    for reach in G._REACH:
        c = np.flatnonzero(removed & (scores >= np.float32(top - reach)))
        if c.size >= want:
            cand = c
            break
    if cand is None:
        cand = np.flatnonzero(removed)
    vals = scores[cand]
    part = np.argpartition(-vals, want - 1)[:want] if want < cand.size else np.arange(cand.size)
    order = part[np.lexsort((cand[part], -vals[part]))]
    return tuple((int(cand[i]), float(vals[i]) - lse) for i in order)


# --- recording an answer ------------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
                          "required": ["city"]}}}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["red", "x y"]}, "maxItems": 2}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


def _requests() -> dict[str, GenerationRequest]:
    ask = ({"role": "user", "content": "What is the weather in Paris?"},)
    return {
        "json_schema": GenerationRequest(messages=({"role": "user", "content": "Describe a person as JSON."},),
                                         max_new_tokens=40, constraint=Constraint.json_schema(SCHEMA), top_n=10,
                                         sampler=SamplerSettings(temperature=0.7, top_k=40, seed=7)),
        "tool_required": GenerationRequest(messages=ask, tools=[WEATHER], tool_choice="required", max_new_tokens=40,
                                           top_n=10, sampler=SamplerSettings(temperature=1.0, seed=3)),
        "tools_auto": GenerationRequest(messages=ask, tools=[WEATHER], tool_choice="auto", max_new_tokens=24,
                                        top_n=10, sampler=SamplerSettings(temperature=0.0)),
    }


def _record(backend, request, monkeypatch, call):
    """(the stage's steps and returned rows, the answer's tokens) with `call` as the stage's __call__."""
    steps: list[tuple[GrammarStep, bytes, str]] = []

    def recording(self, scores, ctx):
        out = call(self, scores, ctx)
        steps.append((self.last, out.tobytes(), str(out.dtype)))
        return out

    with monkeypatch.context() as m:
        m.setattr(G.GrammarStage, "__call__", recording)
        backend.trim_cache(0)
        events = list(generate_events(backend, request))
    assert isinstance(events[-1], Done)
    tokens = [(e.token_id, e.logprob, e.sampler_logprob, e.rank, e.entropy, e.constraint,
               tuple((p.token_id, p.logprob) for p in e.top_model), tuple((p.token_id, p.logprob) for p in e.top_sampler))
              for e in events if isinstance(e, TokenEvent)]
    return steps, tokens, events[-1].stats


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["json_schema", "tool_required", "tools_auto"])
def test_the_stage_reports_the_same_numbers_as_before(default_llamacpp, monkeypatch, kind):
    request = _requests()[kind]
    new_steps, new_tokens, new_stats = _record(default_llamacpp, request, monkeypatch, G.GrammarStage.__call__)
    old_steps, old_tokens, old_stats = _record(default_llamacpp, request, monkeypatch, _old_call)
    assert len(new_steps) >= 8 and len(new_steps) == len(old_steps)
    for i, (new, old) in enumerate(zip(new_steps, old_steps)):
        assert new[0] == old[0], f"step {i}: {new[0]} != {old[0]}"  # dataclass ==: every float exactly
        assert new[1:] == old[1:], f"step {i}: the returned row differs"
    assert new_tokens == old_tokens
    assert (new_stats.text, new_stats.constraint_logprob, new_stats.constraint_status) == (
        old_stats.text, old_stats.constraint_logprob, old_stats.constraint_status)
    if kind == "tools_auto":  # the cheap path ran: few tokens banned, a report of them all the same
        assert all(s.allowed > 40000 and s.disallowed for s, _, _ in new_steps)
    if kind == "tool_required":
        assert any(s.forced for s, _, _ in new_steps) and any(s.allowed < 1000 and not s.forced for s, _, _ in new_steps)
