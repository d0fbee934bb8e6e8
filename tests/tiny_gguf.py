"""A tiny random-weight Llama written as a GGUF file with the `gguf` package, for llama.cpp tests.

Its vocabulary is byte-level BPE with one merge (" t"; llama.cpp wants at
least one): the 256 byte symbols, "Ġt" and three special tokens, so every
other UTF-8 byte is its own token and an emoji or a CJK character always
spans several tokens (what the stream detokenizer must
handle). Two layers of width 64: llama.cpp loads it in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 257, 258, 259
BOS_ID, EOS_ID = 258, 259
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (`bytes_to_unicode`), in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tiny_llama_gguf(
    path: Path, *, seed: int = 0, n_ctx: int = 256, layers: int = 2, chat_template: str = CHAT_TEMPLATE,
    extra_specials: tuple[str, ...] = (),
) -> Path:
    """`extra_specials`: more control tokens after the three (e.g. reasoning markers), ids 260 on."""
    from gguf import GGUFWriter, LlamaFileType, TokenType

    rng = np.random.default_rng(seed)
    symbols = byte_symbols()
    merged = symbols[ord(" ")] + "t"
    specials = list(SPECIALS) + list(extra_specials)
    tokens = symbols + [merged] + specials
    vocab, embd, ff, heads, kv_heads = len(tokens), 64, 128, 4, 2
    head_dim = embd // heads
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny-random-llama")
    w.add_context_length(n_ctx)
    w.add_embedding_length(embd)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(LlamaFileType.ALL_F32)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([TokenType.NORMAL] * 257 + [TokenType.CONTROL] * len(specials))
    w.add_token_merges([f"{symbols[ord(' ')]} t"])
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(False)
    w.add_chat_template(chat_template)  # another one for tests of hostile templates

    def t(name: str, *shape: int, scale: float = 0.1) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    # Larger embeddings/head than a default init, so distributions are neither flat nor one-hot.
    t("token_embd.weight", vocab, embd, scale=1.0)
    w.add_tensor("output_norm.weight", np.ones(embd, dtype=np.float32))
    t("output.weight", vocab, embd, scale=0.25)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(embd, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", embd, embd)
        t(f"blk.{i}.attn_k.weight", kv_heads * head_dim, embd)
        t(f"blk.{i}.attn_v.weight", kv_heads * head_dim, embd)
        t(f"blk.{i}.attn_output.weight", embd, embd)
        t(f"blk.{i}.ffn_gate.weight", ff, embd)
        t(f"blk.{i}.ffn_up.weight", ff, embd)
        t(f"blk.{i}.ffn_down.weight", embd, ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
