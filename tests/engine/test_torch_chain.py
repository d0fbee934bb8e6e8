"""The sampler chain on torch tensors (engine/sampling/torch_chain.py, issue 49 item 1) against the numpy chain.

On real rows of logits -- the default model's 49k vocabulary and Gemma 3's 262k, both on llama.cpp -- each
covered stage alone and whole chains in the default order must keep the same survivors as the numpy chain
(engine/sampling/chain.py), with the same probabilities to float32 tolerance, choose the same token greedily
and over 50 seeded draws, and report the same numbers (log-prob, rank, entropy, the top N before and after).
A torch CPU tensor is a device: the same code runs on CUDA. Settings it does not cover refuse, in words.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from engine.backend import prefill  # noqa: E402
from engine.sampling import SamplerChain, SamplerSettings  # noqa: E402
from engine.sampling.pick import Pick  # noqa: E402
from engine.sampling.settings import DEFAULT_SAMPLER  # noqa: E402
from engine.sampling.torch_chain import TorchChain  # noqa: E402

PROMPT = [{"role": "user", "content": "Name three colours and say which one you like best."}]
ROWS = 3  # the prompt's last row and the next two (greedy) steps: a peaked row and flatter ones
EMPTY = np.zeros(0, dtype=np.int64)

# Each covered stage alone (the default order, every other stage at its neutral value), then whole chains.
ALONE = {
    "top_k": dict(top_k=40),
    "top_p": dict(top_p=0.9),
    "min_p": dict(min_p=0.05),
    "typical_p": dict(typical_p=0.9),
    "top_n_sigma": dict(top_n_sigma=1.0),
    "xtc": dict(xtc_probability=1.0, xtc_threshold=0.02),  # fires every step; a low threshold so it cuts
    "temperature": dict(temperature=0.7),
    "smoothing": dict(smoothing_factor=0.4, smoothing_curve=1.5),
    # the whole row (262k: above 64k survivors, float64 on the device; 49k: llama.cpp's float32 sums)
    "dynatemp": dict(temperature=0.8, dynatemp_range=0.5, dynatemp_exponent=1.3),
    "dynatemp_after_min_p": dict(temperature=1.1, dynatemp_range=0.6, min_p=0.02),
    # a temperature that comes out ~0 keeps only the top token (lo = 0, a tiny entropy to a large power)
    "dynatemp_to_zero": dict(temperature=0.5, dynatemp_range=0.5, dynatemp_exponent=100.0),
    "logit_bias": dict(logit_bias={15: 3.0, 28: float("-inf"), 1200: 2.5, 40000: -1.0}),
}
WHOLE = {
    "llamacpp_defaults": dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    "every_covered_stage": dict(top_n_sigma=2.0, top_k=100, typical_p=0.98, top_p=0.98, min_p=0.01,
                                xtc_probability=0.5, xtc_threshold=0.05, temperature=1.3),
    "flat_hot": dict(temperature=1.5, min_p=0.01),
}
CASES = {**ALONE, **WHOLE}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """torch's CPU ops on one thread, as numpy's: on a loaded 2-core machine two OpenMP threads made a pick
    of 49k entries 10x slower (each op waits for the other thread). Restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _rows(backend) -> list[np.ndarray]:
    backend.trim_cache(0)
    prompt = backend.tokenizer.chat_ids(PROMPT)
    logits, _ = prefill(backend, prompt)
    rows = [np.array(logits, dtype=np.float32)]
    for _ in range(ROWS - 1):
        rows.append(np.array(backend.forward([int(np.argmax(rows[-1]))]), dtype=np.float32))
    return rows


@pytest.fixture(scope="module")
def smollm_rows(default_llamacpp) -> list[np.ndarray]:
    return _rows(default_llamacpp)


@pytest.fixture(scope="module")
def gemma_rows(gemma_llamacpp) -> list[np.ndarray]:
    assert gemma_llamacpp.n_vocab == 262144
    return _rows(gemma_llamacpp)


@pytest.fixture(params=["smollm_49k", "gemma_262k"])
def rows(request) -> list[np.ndarray]:
    return request.getfixturevalue("smollm_rows" if request.param == "smollm_49k" else "gemma_rows")


def assert_same_report(mine: Pick, ref: Pick) -> None:
    assert mine.token_id == ref.token_id and mine.forced == ref.forced
    assert mine.rank == ref.rank
    assert mine.logprob == pytest.approx(ref.logprob, rel=1e-5, abs=1e-6)
    assert mine.entropy == pytest.approx(ref.entropy, rel=1e-5, abs=1e-6)
    assert mine.sampler_logprob == pytest.approx(ref.sampler_logprob, rel=1e-5, abs=1e-6)
    for got, want in ((mine.top_model, ref.top_model), (mine.top_sampler, ref.top_sampler)):
        assert [t.token_id for t in got] == [t.token_id for t in want]
        np.testing.assert_allclose([t.logprob for t in got], [t.logprob for t in want], rtol=1e-5, atol=1e-6)
    assert mine.stages is None


def assert_same_choice(got, want) -> np.ndarray:
    """The torch chain's choice against the numpy chain's: the same survivors, their probabilities within
    float32, the same report; returns the numpy chain's final log-probs."""
    lp_want, lp_got = want.final_distribution(), got.final_distribution()
    kept = np.isfinite(lp_want)
    np.testing.assert_array_equal(np.isfinite(lp_got), kept)
    np.testing.assert_allclose(np.exp(lp_got[kept]), np.exp(lp_want[kept]), rtol=1e-5, atol=1e-9)
    assert_same_report(got.report(20), want.report(20))
    return lp_want


@pytest.mark.parametrize("case", sorted(CASES))
def test_survivors_probabilities_and_report_are_the_numpy_chains(rows, case: str) -> None:
    settings = SamplerSettings(seed=7, **CASES[case])
    ref, mine = SamplerChain(settings), TorchChain(settings)
    cut = False
    for row in rows:
        want = ref.choose(row, EMPTY)
        got = mine.choose(torch.from_numpy(row))
        lp_want, lp_got = want.final_distribution(), got.final_distribution()
        kept = np.isfinite(lp_want)
        np.testing.assert_array_equal(np.isfinite(lp_got), kept)  # the same survivors
        cut |= not kept.all()
        np.testing.assert_allclose(np.exp(lp_got[kept]), np.exp(lp_want[kept]), rtol=1e-5, atol=1e-9)
        for top_n in (20, 0):
            assert_same_report(got.report(top_n), want.report(top_n))
    assert cut or case in ("temperature", "smoothing", "dynatemp"), "the stage never removed a token on these rows: the case tests nothing"


@pytest.mark.parametrize("case", ["llamacpp_defaults", "every_covered_stage", "flat_hot"])
def test_fifty_seeded_draws_and_greedy_choose_the_numpy_chains_tokens(rows, case: str) -> None:
    settings = SamplerSettings(seed=1234, **WHOLE[case])
    ref, mine = SamplerChain(settings), TorchChain(settings)
    assert mine.seed == ref.seed == 1234
    want = [ref.pick(rows[i % ROWS], EMPTY).token_id for i in range(50)]
    got = [mine.pick(torch.from_numpy(rows[i % ROWS])).token_id for i in range(50)]
    assert got == want
    assert len(set(want)) > 1 or case == "llamacpp_defaults"  # the draws are not all the argmax
    greedy = settings.with_(temperature=0)
    for row in rows:
        g_ref, g_mine = SamplerChain(greedy).pick(row, EMPTY), TorchChain(greedy).pick(torch.from_numpy(row))
        assert_same_report(g_mine, g_ref)  # the same token, the argmax alone after the stages


def test_a_forced_token_is_reported_as_the_numpy_chain_reports_it(smollm_rows) -> None:
    row = smollm_rows[0]
    settings = SamplerSettings(seed=3, **WHOLE["llamacpp_defaults"])
    outside = int(np.argsort(row)[len(row) // 2])  # a token every filter removed: sampler log-prob -inf
    for token in (int(np.argmax(row)), outside):
        want = SamplerChain(settings).pick(row, EMPTY, force_token=token)
        got = TorchChain(settings).pick(torch.from_numpy(row), force_token=token)
        assert_same_report(got, want)
    assert got.sampler_logprob == -np.inf and got.forced


def test_bfloat16_logits_are_used_as_float32() -> None:
    rng = np.random.default_rng(5)
    row = torch.from_numpy((rng.standard_normal(1000) * 3).astype(np.float32)).to(torch.bfloat16)
    settings = SamplerSettings(seed=9, **WHOLE["llamacpp_defaults"])
    want = SamplerChain(settings).pick(row.float().numpy(), EMPTY)
    assert_same_report(TorchChain(settings).pick(row), want)


PENALTIES = {
    "repetition": dict(repetition_penalty=1.3),
    "presence_and_frequency": dict(presence_penalty=0.7, frequency_penalty=0.4, penalty_last_n=-1),
    "all_three_after_top_k": dict(repetition_penalty=0.8, presence_penalty=0.5, frequency_penalty=0.3, top_k=60,
                                  order=("top_k", "penalties", "min_p", "temperature"), min_p=0.02, temperature=0.9),
}


@pytest.mark.parametrize("case", sorted(PENALTIES))
def test_penalties_on_the_device_are_the_numpy_chains(smollm_rows, case: str) -> None:
    """The penalties read the history: the rows' own near-top tokens, repeated, so that they change the pick; on
    the whole row (the default order) and on top-k's survivors (after it), where some seen tokens were cut."""
    settings = SamplerSettings(seed=11, **PENALTIES[case])
    ref, mine = SamplerChain(settings), TorchChain(settings)
    moved = False
    for i, row in enumerate(smollm_rows):
        near_top = np.argsort(-row)[:120]
        history = np.concatenate([near_top[::3], near_top[:8], near_top[:2], [-1, row.size + 5]]).astype(np.int64)
        want = ref.choose(row, history)
        got = mine.choose(torch.from_numpy(row), history=history)
        lp_want = assert_same_choice(got, want)
        kept = np.isfinite(lp_want)
        plain = SamplerChain(settings.with_(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0))
        moved |= not np.allclose(plain.choose(row, history).final_distribution()[kept], lp_want[kept])
    assert moved, "the penalties changed nothing on these rows: the case tests nothing"


@pytest.mark.parametrize("order", [("logit_bias", "top_k", "temperature"), ("top_k", "logit_bias", "temperature")],
                         ids=["on the whole row", "on top-k's survivors"])
def test_a_logit_bias_on_the_rows_own_top_tokens_is_the_numpy_chains(smollm_rows, order) -> None:
    """Biases on tokens near each row's top, so they move the pick: one named twice (its biases add up), one
    removed (-inf), one past top-k's cut; on the whole row and, after top-k, on its survivors."""
    for row in smollm_rows:
        near = [int(t) for t in np.argsort(-row)[:80]]
        bias = ((near[0], -2.5), (near[1], float("-inf")), (near[5], 1.75), (near[5], 0.5), (near[70], 4.0))
        settings = SamplerSettings(seed=4, top_k=40, temperature=0.9, logit_bias=bias, order=order)
        ref, mine = SamplerChain(settings), TorchChain(settings)
        want, got = ref.choose(row, EMPTY), mine.choose(torch.from_numpy(row))
        lp_want = assert_same_choice(got, want)
        assert not np.isfinite(lp_want[near[1]])


@pytest.mark.parametrize("order", [None, ("top_k", "dry", "temperature")], ids=["default order", "after top-k"])
def test_dry_on_the_device_is_the_numpy_chains(smollm_rows, order) -> None:
    """A history that repeats a run of the row's near-top tokens: DRY pushes down the token that followed the
    run before (the row's top one), by the numpy stage's own amounts; on the whole row and on survivors."""
    kw = {"order": order} if order else {}
    settings = SamplerSettings(seed=8, dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2,
                               dry_sequence_breakers=(), top_k=50, temperature=0.9, **kw)
    moved = False
    for row in smollm_rows:
        near = [int(t) for t in np.argsort(-row)[:40]]
        run = near[3:9]
        history = np.array(near[20:30] + run + [near[0]] + near[30:35] + run, dtype=np.int64)
        ref, mine = SamplerChain(settings), TorchChain(settings)
        want, got = ref.choose(row, history), mine.choose(torch.from_numpy(row), history=history)
        lp_want = assert_same_choice(got, want)
        moved |= int(np.argmax(lp_want)) != near[0]
    assert moved, "DRY never moved the top token on these rows: the case tests nothing"


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat_learns_its_mu_as_the_numpy_chains_does(rows, version: int) -> None:
    """Mirostat's cut follows `mu`, which learns from every pick: one chain of each kind over the rows in turn,
    seeded draws, then a forced token, a state saved and put back: the same survivors, tokens and mu."""
    settings = SamplerSettings(seed=21, temperature=0.9, mirostat=version, mirostat_tau=3.0, mirostat_eta=0.3)
    ref, mine = SamplerChain(settings), TorchChain(settings)
    cut = False
    for i, row in enumerate(rows + rows):
        force = int(np.argsort(-row)[3]) if i == 2 else None
        if i == 4:
            saved = ref.state()
            assert mine.state() == pytest.approx(saved, rel=1e-6)
        want = ref.choose(row, EMPTY, force_token=force)
        got = mine.choose(torch.from_numpy(row), force_token=force)
        lp_want = assert_same_choice(got, want)
        cut |= not np.isfinite(lp_want).all()
        if i == 5:  # back to the state before pick 4, on both
            ref.restore(saved)
            mine.restore(saved)
    assert cut
    assert mine.state() == pytest.approx(ref.state(), rel=1e-6)
    assert ref.state() != (2 * 3.0,), "mu never moved: the case tests nothing"


@pytest.mark.parametrize("extra", [{}, {"top_k": 60, "min_p": 0.01}], ids=["the whole row", "survivors"])
def test_adaptive_p_learns_its_average_as_the_numpy_chains_does(rows, extra) -> None:
    """Adaptive-p reshapes toward a target corrected by the picks' moving average: one chain of each over the
    rows in turn, a forced token and a restored state: the same distributions, tokens and average."""
    settings = SamplerSettings(seed=31, temperature=0.9, adaptive_target=0.4, adaptive_decay=0.8, **extra)
    ref, mine = SamplerChain(settings), TorchChain(settings)
    for i, row in enumerate(rows + rows):
        force = int(np.argsort(-row)[2]) if i == 1 else None
        if i == 3:
            saved = ref.state()
            assert mine.state()[0] == pytest.approx(saved[0], rel=1e-6)
        want = ref.choose(row, EMPTY, force_token=force)
        got = mine.choose(torch.from_numpy(row), force_token=force)
        assert_same_choice(got, want)
        if i == 4:
            ref.restore(saved)
            mine.restore(saved)
    assert mine.state()[0] == pytest.approx(ref.state()[0], rel=1e-6)  # (weighted sum, total weight)
    assert ref.state()[0] != (0.4 / 0.2, 1 / 0.2), "the average never moved: the case tests nothing"


def test_a_logit_bias_past_the_vocabulary_says_so() -> None:
    mine = TorchChain(SamplerSettings(logit_bias=((70000, 1.0),)))
    with pytest.raises(ValueError, match="vocabulary has 49152 tokens"):
        mine.choose(torch.zeros(49152))


UNSUPPORTED = {
    "banned_strings": (dict(banned_strings=("hello",)), "banned strings"),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_settings_it_does_not_cover_refuse_with_the_reason(name: str) -> None:
    changes, words = UNSUPPORTED[name]
    settings = DEFAULT_SAMPLER.with_(**changes)
    support = TorchChain.supports(settings)
    assert not support and words in support.reason and "SamplerChain" in support.reason
    with pytest.raises(ValueError, match=words):
        TorchChain(settings)


def test_a_custom_stage_refuses_and_neutral_stages_do_not() -> None:
    custom = DEFAULT_SAMPLER.with_stage("mine", lambda lp, history: lp, after="top_k")
    support = TorchChain.supports(custom)
    assert not support and "'mine'" in support.reason
    # off stages in the order (penalties 1, DRY 0, mirostat 0 ...) and greedy with a dynamic range are fine
    assert TorchChain.supports(SamplerSettings())
    assert TorchChain.supports(DEFAULT_SAMPLER)
    assert TorchChain.supports(SamplerSettings(temperature=0, dynatemp_range=0.5, top_k=40))


def test_importing_it_needs_no_torch() -> None:
    root = Path(__file__).resolve().parents[2]
    code = ("import sys; sys.modules['torch'] = None; import engine.sampling.torch_chain as t; "
            "from engine.sampling import SamplerSettings; print(bool(t.TorchChain.supports(SamplerSettings())))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def _odd_rows() -> dict[str, np.ndarray]:
    """Rows real logits seldom give: ties at every cut, removed tokens (-inf), one far top, all tied."""
    rng = np.random.default_rng(3)
    peaked = (rng.standard_normal(50_000) * 3).astype(np.float32)
    peaked[[7, 900, 40_000]] = 25.0  # tied at the top
    ties = np.round(rng.standard_normal(30_000) * 2).astype(np.float32)
    with_inf = peaked.copy()
    with_inf[::3] = -np.inf
    far = peaked.copy()
    far[100] = 200.0
    few = np.full(5000, -np.inf, dtype=np.float32)
    few[[3, 50, 4000]] = [1.0, 2.0, 2.0]  # fewer finite tokens than top-k and the top N
    return {"peaked": peaked, "ties": ties, "with_inf": with_inf, "far_top": far, "few_finite": few,
            "flat": np.zeros(4096, dtype=np.float32)}


@pytest.mark.parametrize("case", ["llamacpp_defaults", "every_covered_stage", "top_p", "typical_p", "top_n_sigma",
                                  "xtc"])
@pytest.mark.parametrize("name", sorted(_odd_rows()))
def test_ties_and_removed_tokens_are_handled_as_the_numpy_chain_does(name: str, case: str) -> None:
    row = _odd_rows()[name]
    settings = SamplerSettings(seed=5, **CASES[case])
    ref, mine = SamplerChain(settings), TorchChain(settings)
    for _ in range(3):
        want, got = ref.choose(row, EMPTY), mine.choose(torch.from_numpy(row))
        lp_want = assert_same_choice(got, want)
        kept = np.isfinite(lp_want)
