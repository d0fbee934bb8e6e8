"""DRY's sequence breakers cannot hold the model (issue 43 item 7): at most 64 of at most 40 characters, wherever
settings are made (the server, the CLI, the window all build `SamplerSettings`), and the scan of the vocabulary
for them costs milliseconds instead of a Python pass per breaker prefix (1,000 breakers held the model ~64 s
before the first token, where no cancel was looked at).

The scan must still find exactly what llama.cpp's `get_overlapping_token_sequences` finds: it is checked
against the plain scan (the former implementation, written out below) on the default model's vocabulary.
"""

from __future__ import annotations

import time

import pytest

from engine.sampling.dry import MAX_TAIL_TOKENS, breaker_sequences
from engine.sampling.settings import DEFAULT_DRY_BREAKERS, DRY_MAX_BREAKERS, SamplerSettings

pytestmark = [pytest.mark.model]


@pytest.fixture(scope="module")
def tokenizer():
    from engine import Engine

    engine = Engine.load()
    yield engine.tokenizer
    engine.close()


def plain_scan(vocab, breakers, n_vocab):
    """The scan as llama.cpp describes it, one pass over the vocabulary per breaker and per prefix of it."""
    words = [vocab.token_bytes(i) for i in range(n_vocab)]
    seqs: dict[int, list[tuple[int, ...]]] = {}

    def add(token, tail):
        tails = seqs.setdefault(token, [])
        if tail not in tails:
            tails.append(tail)

    for breaker in breakers:
        b = breaker.encode("utf-8")
        contains = [i for i, w in enumerate(words) if b in w]
        contained = set(contains)
        for i in contains:
            add(i, ())
        for j in range(len(b) - 1, 0, -1):
            enders = [i for i, w in enumerate(words) if i not in contained and w.endswith(b[:j])]
            if enders:
                tail = tuple(vocab.encode(b[j:].decode("utf-8", "replace"), add_special_tokens=False)[:MAX_TAIL_TOKENS])
                for i in enders:
                    add(i, tail)
    return {t: tuple(tails) for t, tails in seqs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("breakers", [
    DEFAULT_DRY_BREAKERS,
    ("\n\n", "ing", "e s", "Question:", "é", "日本", "\x00a", " the"),
    ("a", "ab", "abc"),  # breakers that contain each other share head tokens
], ids=["default", "mixed", "nested"])
def test_the_scan_finds_what_the_plain_scan_finds(tokenizer, breakers):
    from engine.tokenizer import vocabulary_size

    n_vocab = vocabulary_size(tokenizer)
    assert breaker_sequences(tokenizer, breakers, n_vocab) == plain_scan(tokenizer, breakers, n_vocab)


@pytest.mark.slow
def test_the_most_breakers_allowed_are_found_in_well_under_a_second(tokenizer):
    from engine.tokenizer import vocabulary_size

    n_vocab = vocabulary_size(tokenizer)
    # 64 breakers of 40 characters, each starting the way many tokens end (every prefix finds heads), none seen
    # before (the result is cached per breaker set).
    def breakers(stamp: str) -> tuple[str, ...]:
        return tuple((f"{'e' * (i % 5 + 1)} s{'t' * (i % 3)}{stamp}{i}" + "x" * 40)[:40] for i in range(DRY_MAX_BREAKERS))

    # The first set builds the vocabulary's index (once per tokenizer: 71 s per set before, 2 s now on two
    # busy cores); a next set only asks it.
    started = time.monotonic()
    breaker_sequences(tokenizer, breakers(f"a{time.monotonic_ns()}"), n_vocab)
    cold = time.monotonic() - started
    started = time.monotonic()
    found = breaker_sequences(tokenizer, breakers(f"b{time.monotonic_ns()}"), n_vocab)
    took = time.monotonic() - started
    assert len(found) > 1000  # many heads: the scan did its work
    assert cold < 8, f"{cold:.2f} s for the first {DRY_MAX_BREAKERS} breakers of 40 characters"
    assert took < 1.5, f"{took:.2f} s for {DRY_MAX_BREAKERS} breakers of 40 characters"


def test_settings_refuse_more_breakers_than_the_cap():
    SamplerSettings(dry_multiplier=0.8, dry_sequence_breakers=tuple(f"b{i}" for i in range(DRY_MAX_BREAKERS)))
    with pytest.raises(ValueError, match="dry_sequence_breakers takes at most 64 texts, got 10,000"):
        SamplerSettings(dry_multiplier=0.8, dry_sequence_breakers=tuple(f"b{i}" for i in range(10_000)))


def test_a_hostile_breaker_list_gives_a_short_message():
    with pytest.raises(ValueError) as caught:
        SamplerSettings(dry_sequence_breakers=tuple(["x"] * 10_000 + [5]))  # type: ignore[list-item]
    assert len(str(caught.value)) < 400
