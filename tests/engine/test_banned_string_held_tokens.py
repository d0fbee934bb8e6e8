"""A banned phrase that starts in a token whose text the detokenizer was still holding (the first half of a
character) steps back to that token (issue 36 item 14: `--banned-string " "` ended in `KeyError: 0`: the
step-back state of a token that had shown no text yet was thrown away as if its text were released)."""

from __future__ import annotations

import numpy as np

from engine.backends.mock import MockBackend, MockTokenizer
from engine.banned_strings import BannedStringGuard
from engine.decode.loop import generate_events
from engine.events import Done
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

# token ids: 0 end of text, 1 "x" (the prompt), 2 the first byte of "é", 3 the rest of "é" and " cat", 4 "ok"
PIECES = (b"", b"x", b"\xc3", b"\xa9 cat", b"ok")


class SplitCharTokenizer(MockTokenizer):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1]

    def decode(self, ids) -> str:
        return b"".join(PIECES[i] for i in ids if i != 0).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        return PIECES[token_id].decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return PIECES[token_id]


class ScriptedBackend(MockBackend):
    """After the prompt: half a character, then its rest with a space; a step back from it finds "ok"."""

    def __init__(self):
        super().__init__()
        self.tokenizer = SplitCharTokenizer()

    @staticmethod
    def logits_after(tokens) -> np.ndarray:
        logits = np.full(len(PIECES), -10.0, dtype=np.float32)
        nxt = {1: 2, 2: 3, 3: 0, 4: 0}[tokens[-1]]
        logits[nxt] = 10.0
        logits[4] = 5.0  # the runner-up at every step
        return logits


def test_the_guard_keeps_tokens_without_text_held():
    guard = BannedStringGuard([" "])
    assert guard.feed(0, "") == ("", None)  # half a character: no text yet
    assert guard.held_from == 0  # token 0 may still begin a banned phrase
    _, ban = guard.feed(1, "é cat")
    assert ban is not None and ban.start == 0


def test_a_ban_inside_a_held_character_steps_back_to_it():
    request = GenerationRequest(prompt="x", max_new_tokens=4,
                                sampler=SamplerSettings(temperature=0.0, banned_strings=(" ",)))
    events = list(generate_events(ScriptedBackend(), request))
    done = events[-1]
    assert isinstance(done, Done)
    assert " " not in done.stats.text and done.stats.text.startswith("ok")
