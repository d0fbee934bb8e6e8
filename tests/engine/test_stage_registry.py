"""Every reader of the sampler stage registry covers every stage (issue 32 item 3: a stage is one file and one row).

The test walks `engine.sampling.registry.STAGES` and, for each row, turns the stage on (a value found from its own
control's range) and checks each consumer: the chain builds and runs it, llama.cpp JSON carries each of its
fields out and back, every server kind either takes its fields under the row's names or refuses them in words,
and the panel has a control for each field. A row missing any of that fails here, naming the stage.
"""

from __future__ import annotations

from dataclasses import fields as dataclass_fields

import numpy as np
import pytest

from engine.backends.remote.errors import UnsupportedByServerError
from engine.backends.remote.server_params import PARAMETER_NAMES, server_parameters
from engine.cli.main import build_parser, sampler_from_args
from engine.sampling.chain import SamplerChain
from engine.sampling.llamacpp_json import llamacpp_json, parse_llamacpp_json
from engine.sampling.registry import CONTROLS, LLAMA_CPP_SERVER, SERVER_KINDS, STAGE_ROWS, STAGES, StageRow
from engine.sampling.settings import STAGE_NAMES, SamplerSettings
from engine.sampling.stages import StatefulStage

SETTING_ROWS = [row for row in STAGES if row.fields]  # every stage but the constraint's (it comes with a request)


class _Vocab:
    """A byte-per-token vocabulary (DRY's breakers, logit bias by text)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id % 256])


def _candidates(field: str) -> list[object]:
    """Values to try for `field`, from its control: the middle of the slider, the top, the bottom."""
    c = CONTROLS[field]
    if field == "logit_bias":
        return [((5, 1.5),)]
    if c.lines:
        return []
    top = c.slider_max if c.slider_max is not None else c.maximum
    values: list[float] = [(c.minimum + top) / 2, top, c.maximum, c.minimum]
    return [round(v) if c.decimals == 0 else round(v, c.decimals) for v in values]


def turned_on(row: StageRow) -> SamplerSettings:
    """Settings with only `row`'s stage on, at a value its control offers."""
    for field in row.switches:
        for value in _candidates(field):
            try:
                s = SamplerSettings(**{field: value})
            except ValueError:
                continue
            if row.active(s):
                return s
    raise AssertionError(f"no value in the controls of {row.name}'s switches {row.switches} turns it on")


def test_the_registry_has_every_stage_in_the_default_order_and_nothing_else():
    assert tuple(row.name for row in STAGES) == STAGE_NAMES == tuple(STAGE_ROWS)
    settings_fields = {f.name for f in dataclass_fields(SamplerSettings)}
    for row in STAGES:
        assert set(row.fields) <= settings_fields, row.name
        assert set(row.switches) <= set(row.fields), row.name
    owned = [f for row in STAGES for f in row.fields]
    assert len(owned) == len(set(owned)), "a settings field belongs to one stage"


@pytest.mark.parametrize("row", SETTING_ROWS, ids=lambda r: r.name)
def test_the_chain_builds_every_stage_from_its_row_and_runs_it(row: StageRow):
    on = turned_on(row)
    chain = SamplerChain(on, vocab=_Vocab())
    assert row.name in chain.stage_names
    assert row.name not in SamplerChain(SamplerSettings(), vocab=_Vocab()).stage_names  # off at the neutral value
    stage = dict(chain.stages)[row.name]
    assert bool(chain.state()) == isinstance(stage, StatefulStage)  # stateful stages are told every pick
    logits = np.random.default_rng(0).standard_normal(300).astype(np.float32)
    pick = chain.pick(logits, np.arange(40) % 7, record_stages=True)
    assert 0 <= pick.token_id < 300 and row.name in [st.name for st in pick.stages or ()]


@pytest.mark.parametrize("row", SETTING_ROWS, ids=lambda r: r.name)
def test_llamacpp_json_carries_every_field_of_every_stage_out_and_back(row: StageRow):
    for field in row.fields:
        assert field in row.llamacpp or field in row.not_llamacpp, f"{row.name}: {field} has no llama.cpp JSON key"
    on = turned_on(row)
    text, _ = llamacpp_json(on)
    back = parse_llamacpp_json(text).sampler
    for field in row.fields:
        assert getattr(back, field) == getattr(on, field), f"{row.name}: {field} did not come back"
    assert row.active(back) and row.name in back.order
    if row.llamacpp_sampler is not None:
        assert parse_llamacpp_json({"samplers": [row.llamacpp_sampler]}).sampler.order.count(row.name) == 1
        assert parse_llamacpp_json({"samplers": row.llamacpp_char}).sampler.order.count(row.name) == 1


@pytest.mark.parametrize("row", SETTING_ROWS, ids=lambda r: r.name)
@pytest.mark.parametrize("kind", (*SERVER_KINDS, LLAMA_CPP_SERVER))
def test_every_server_kind_takes_a_stage_under_its_rows_names_or_refuses_it_in_words(row: StageRow, kind: str):
    on = turned_on(row)
    names = {f: kinds[kind] for f, kinds in row.server.items() if kind in kinds}
    if kind == LLAMA_CPP_SERVER:
        names = dict(row.llamacpp)
    assert all(PARAMETER_NAMES[kind].get(f) == n for f, n in names.items())
    try:
        params = server_parameters(on, kind, seed_supported=True)
    except UnsupportedByServerError as e:
        assert any(f in str(e) for f in row.fields), f"{kind} refused {row.name} without naming it: {e}"
        assert kind != LLAMA_CPP_SERVER or row.not_llamacpp, f"llama.cpp refused {row.name}: {e}"
        return
    for field, name in names.items():
        assert name in params, f"{kind}: {row.name}'s {field} was not sent as {name}"
    for field in row.switches:  # a server ignores what it does not know: never sent and not refused is a silent loss
        if getattr(on, field) != getattr(SamplerSettings(), field):
            assert field in names, f"{kind}: {row.name} is on ({field}) and was neither sent nor refused"


@pytest.mark.parametrize("row", STAGES, ids=lambda r: r.name)
def test_every_stage_setting_has_a_panel_control_and_the_stage_a_line_of_help(row: StageRow):
    assert row.help
    for field in row.fields:
        c = CONTROLS.get(field)
        assert c is not None and c.label and c.tip, f"{row.name}: {field} has no control"
        if not c.lines:
            assert c.minimum < c.maximum and c.step > 0, f"{row.name}: {field}'s range"
            SamplerSettings(**{field: c.minimum})  # the control's range is one the settings accept
            SamplerSettings(**{field: c.maximum})



@pytest.mark.parametrize("row", SETTING_ROWS, ids=lambda r: r.name)
def test_every_number_setting_of_every_stage_has_a_command_line_flag(row: StageRow):
    on = turned_on(row)
    for field in row.fields:
        c = CONTROLS[field]
        if c.lines:  # lists have flags of their own (--logit-bias, --dry-sequence-breaker)
            continue
        assert c.cli and c.cli_help, f"{row.name}: {field} has no command-line flag"
        value = getattr(on, field) if field in row.switches and row.active(on) else getattr(SamplerSettings(), field)
        for flag in c.cli:
            args = build_parser().parse_args(["generate", "--prompt", "x", flag, str(value)])
            assert getattr(sampler_from_args(args), field) == value, f"{flag} {value}"
