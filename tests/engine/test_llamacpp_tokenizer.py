"""The llama.cpp tokenizer adapter against the Hugging Face tokenizer of the same model, and streaming."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from engine.backends.llamacpp import LlamaCppBackend  # noqa: E402
from engine.tokenizer import StreamDetokenizer, Tokenizer  # noqa: E402

TEXTS = [
    "The capital of France is Paris.",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "emoji 🐉👋🏽 and CJK 世界你好, accents é à ü, math ∑ ≤ ∞",
    "<|im_start|>user\nhi<|im_end|>\n",
    "",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 👋"}],
    [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 世界?"},
    ],
]


@pytest.fixture(scope="module")
def hf(default_model_folder) -> Tokenizer:
    return Tokenizer.from_folder(default_model_folder)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_text_and_ids_equal_the_hf_tokenizers(default_llamacpp, hf, add_generation_prompt):
    ours = default_llamacpp.tokenizer
    assert ours.has_chat_template
    for messages in CONVERSATIONS:
        assert ours.chat_text(messages, add_generation_prompt) == hf.chat_text(messages, add_generation_prompt)
        assert ours.chat_ids(messages, add_generation_prompt) == hf.chat_ids(messages, add_generation_prompt)


def test_encode_decode_token_text_and_bytes_equal_the_hf_tokenizers(default_llamacpp, hf):
    ours = default_llamacpp.tokenizer
    for text in TEXTS:
        ids = hf.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == hf.decode(ids) == text
        for i in ids:
            assert ours.token_text(i) == hf.token_text(i)
            assert ours.token_bytes(i) == hf.token_bytes(i)
    assert b"".join(ours.token_bytes(i) for i in ours.encode(TEXTS[2])) == TEXTS[2].encode()


def test_end_of_generation_ids_include_the_hf_ones(default_llamacpp, hf):
    assert hf.eos_token_ids <= default_llamacpp.tokenizer.eos_token_ids


@pytest.mark.parametrize("model", ["default", "tiny"])
def test_streamed_text_with_emoji_and_cjk_equals_decoding_all_ids(model, default_llamacpp, tiny_gguf):
    if model == "default":
        backend, close = default_llamacpp, False
    else:  # byte-level vocabulary without merges: every multi-byte character spans several tokens
        backend, close = LlamaCppBackend(tiny_gguf, spec="tiny", display_name="tiny"), True
    try:
        tok = backend.tokenizer
        for text in TEXTS[:3]:
            context = tok.encode("Say:")
            ids = tok.encode(text, add_special_tokens=False)
            detok = StreamDetokenizer(tok, context_ids=context)
            pieces = [detok.add(i) for i in ids]
            streamed = "".join(pieces) + detok.flush()
            assert streamed == tok.decode(ids) == text
            assert all("\ufffd" not in p for p in pieces)  # half a character is held back, never shown
    finally:
        if close:
            backend.close()


def test_a_closed_models_tokenizer_fails_cleanly(tiny_gguf):
    backend = LlamaCppBackend(tiny_gguf, spec="tiny", display_name="tiny")
    tok = backend.tokenizer
    backend.close()
    with pytest.raises(RuntimeError, match="closed"):
        tok.encode("hi")
