"""Tokens that hold part of a multi-byte character: their bytes, and answers cut in the middle of one.

SmolLM2's vocabulary is byte-level BPE (an emoji is three tokens, each shown
as U+FFFD on its own); a byte-fallback SentencePiece vocabulary (Llama 2,
Mistral, Gemma) spells bytes as `<0xF0>` pieces, built here in a few lines
with the `tokenizers` library.
"""

from __future__ import annotations

import pytest

from engine.decode.loop import generate_events
from engine.events import Done, TokenEvent
from engine.request import GenerationRequest
from engine.sampling import SamplerSettings
from engine.tokenizer import REPLACEMENT, StreamDetokenizer, Tokenizer, incomplete_utf8_tail

TEXT = "Hi 😀 and 日本語, café!"


@pytest.fixture(scope="module")
def smollm_tokenizer(default_model_folder) -> Tokenizer:
    return Tokenizer.from_folder(default_model_folder)


@pytest.fixture(scope="module")
def byte_fallback_tokenizer() -> Tokenizer:
    """A SentencePiece-style BPE with byte fallback: a few pieces, every byte as `<0xXX>`."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ("▁", "H", "i", "▁H", "▁Hi", "a", "n", "d", "▁a", "▁and", "c", "f", "▁c", ",", "!", "é"):
        vocab.setdefault(piece, len(vocab))
    merges = [("▁", "H"), ("▁H", "i"), ("▁", "a"), ("▁a", "n"), ("▁an", "d")]
    vocab.setdefault("▁an", len(vocab))
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    raw.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    return Tokenizer(hf, [2])


@pytest.fixture(params=["byte-level BPE (SmolLM2)", "SentencePiece byte fallback"])
def tokenizer(request, smollm_tokenizer, byte_fallback_tokenizer) -> Tokenizer:
    return smollm_tokenizer if request.param.startswith("byte-level") else byte_fallback_tokenizer


def test_token_bytes_rebuild_the_text_and_show_what_decode_hides(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    raw = [tokenizer.token_bytes(i) for i in ids]
    assert b"".join(raw).decode("utf-8").strip() == TEXT  # (SentencePiece: a leading "▁" space)
    # Some tokens are parts of characters: their text alone is U+FFFD, their bytes are not valid UTF-8 alone.
    partial = [(i, b) for i, b in zip(ids, raw) if incomplete_utf8_tail(b) or not _valid(b)]
    assert partial, "the test text was not split inside any character"
    for i, b in partial:
        assert REPLACEMENT in tokenizer.token_text(i)
    # Whole tokens' bytes are their text.
    for i, b in zip(ids, raw):
        if _valid(b) and tokenizer.token_text(i).strip():
            assert b.decode("utf-8").strip() == tokenizer.token_text(i).strip()


def test_byte_fallback_pieces_are_single_bytes(byte_fallback_tokenizer):
    tok = byte_fallback_tokenizer
    ids = tok.encode("😀", add_special_tokens=False)
    assert [tok.hf.convert_ids_to_tokens(i) for i in ids][-4:] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert [tok.token_bytes(i) for i in ids][-4:] == [b"\xf0", b"\x9f", b"\x98", b"\x80"]
    assert tok.token_bytes(2) == b"</s>"  # special tokens are their text


def test_smollm_vocabulary_bytes_agree_with_decode(smollm_tokenizer):
    tok = smollm_tokenizer
    for i in range(0, len(tok.hf), 97):
        text = tok.token_text(i)
        if REPLACEMENT not in text:
            assert tok.token_bytes(i) == text.encode("utf-8"), i


def _valid(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_a_stream_cut_inside_a_character_leaves_it_out_and_continuing_completes_it(tokenizer):
    prompt = tokenizer.encode("Say:", add_special_tokens=False)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    full = _stream(tokenizer, prompt, ids)
    cut_inside = 0
    for k in range(1, len(ids)):
        head = _stream(tokenizer, prompt, ids[:k])  # the answer, cut by the length limit after k tokens
        assert REPLACEMENT not in head
        tail = _stream(tokenizer, prompt + ids[:k], ids[k:])  # Continue: the cut answer is the context
        assert head + tail == full, k
        cut_inside += incomplete_utf8_tail(b"".join(tokenizer.token_bytes(i) for i in ids[:k])) > 0
    assert cut_inside >= 2


def _stream(tokenizer: Tokenizer, context: list[int], ids: list[int]) -> str:
    detok = StreamDetokenizer(tokenizer, context_ids=context)
    return "".join(detok.add(i) for i in ids) + detok.flush()


def test_generation_cut_mid_emoji_ends_cleanly_and_continue_completes_it(tiny_torch):
    tok = tiny_torch.tokenizer
    emoji = tok.encode(" 😀", add_special_tokens=False)
    assert len(emoji) >= 2 and REPLACEMENT in tok.token_text(emoji[0])
    prompt = tok.encode("The face:", add_special_tokens=False)
    greedy = SamplerSettings(temperature=0.0)

    def run(prefix: tuple[int, ...], forced: tuple[int, ...]) -> tuple[list[TokenEvent], Done]:
        tiny_torch.trim_cache(0)
        request = GenerationRequest(
            prompt_ids=tuple(prompt), assistant_prefix=prefix, forced_tokens=forced,
            max_new_tokens=len(forced), sampler=greedy, top_n=5,
        )
        events = list(generate_events(tiny_torch, request))
        return [e for e in events if isinstance(e, TokenEvent)], events[-1]

    # Cut by the length limit after the first byte token of the emoji.
    first, done = run((), (emoji[0],))
    assert done.stats.finish_reason == "length"
    assert REPLACEMENT not in done.stats.text and "".join(e.text for e in first) == done.stats.text
    assert first[0].token_bytes == tok.token_bytes(emoji[0]) and not _valid(first[0].token_bytes)
    assert first[0].token_text == tok.token_text(emoji[0])  # the surface form is unchanged
    # Alternatives that are parts of characters carry their bytes too.
    for alt in first[0].top_model:
        assert (alt.token_bytes is not None) == (REPLACEMENT in alt.text and not _valid(tok.token_bytes(alt.token_id)))

    # Continue: the rest of the emoji completes the character in the text.
    rest, done2 = run((emoji[0],), tuple(emoji[1:]))
    assert done.stats.text + done2.stats.text == " 😀"
    assert rest[-1].token_bytes is not None and rest[-1].text.endswith("😀")
