"""Documents (issue 48 item 6): attaching a 100-page PDF, the attention map of an answer token, decoding after it.

    python bench/documents.py [--model SPEC] [--doc-tokens 4000] [--decode-tokens 64] [--repeat 3] [--cold]

Prints, on the default model unless told:

- `attach_100_pages_s=`: a 100-page PDF built here (tests/documents_files.py's writer) read, its text
  extracted by pypdf and its block tokenized by the model's tokenizer (goal < 2 s);
- `attention_map_s=`: "where the answer looked" for one answer token of a chat whose prompt holds a
  ~4,000-token attached document, timed on the model's worker thread as the window asks for it: the model
  has just written the answer, so the layer view's capture reuses its KV state (goal < 1 s); the first map
  (which also reads the final norm and head from the GGUF) is printed too, and with `--cold` one made after
  the cache was emptied (the whole prompt runs: 84 s for 4,500 tokens on a busy 2-core CPU);
- `decode_ratio_no_map=`: tokens/s of the same greedy answer right after a map over right before it (the
  first pair: before any map), the median of the pairs (1.0: a map leaves nothing behind that slows decoding;
  nothing runs per token when no map is open).

Figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from engine import Engine
from engine.documents import Attachment, block_tokens, compose_message, read_attachment
from engine.documents.attention import attention_map, passages_in_prompt
from engine.request import GenerationRequest
from engine.sampling.settings import SamplerSettings

ROOT = Path(__file__).resolve().parents[1]


def _pdf_writer() -> Any:
    """tests/documents_files.py's make_pdf, loaded from its file (tests/ on sys.path would make tests/engine
    shadow the engine package)."""
    spec = importlib.util.spec_from_file_location("documents_files", ROOT / "tests" / "documents_files.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_pdf

PARAGRAPH = ("Section {n}. The committee met on the {n}th day and reviewed the harbour accounts, the repairs to "
             "the north pier and the schedule of the ferries; it noted that the lamp on pier {n} was replaced.")
FACT = "The vault code is 4729, and only the harbour master knows it."


def bench_attach(eng: Engine, repeat: int) -> float:
    pages = ["\n".join(f"Page {p + 1}, line {i + 1}: the harbour accounts were reviewed and found in order."
                       for i in range(40)) for p in range(100)]
    data = _pdf_writer()(pages)
    times = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "report.pdf"
        path.write_bytes(data)
        for _ in range(repeat):
            t0 = time.perf_counter()
            attachment = read_attachment(path)
            tokens = block_tokens(eng.tokenizer, attachment)
            times.append(time.perf_counter() - t0)
    print(f"  100-page PDF: {len(data) / 1024:.0f} KB, {len(attachment.text):,} characters, {tokens:,} tokens")
    return min(times)


def document(tokenizer: Any, n_tokens: int) -> Attachment:
    """Paragraphs up to about `n_tokens` tokens, the fact in the middle."""
    paragraphs: list[str] = []
    while len(tokenizer.encode("\n\n".join(paragraphs), add_special_tokens=False)) < n_tokens:
        paragraphs.extend(PARAGRAPH.format(n=len(paragraphs) + i + 1) for i in range(10))
    paragraphs.insert(len(paragraphs) // 2, FACT)
    text = "\n\n".join(paragraphs) + "\n"
    data = text.encode("utf-8")
    return Attachment("minutes.txt", len(data), "text", text, hashlib.sha256(data).hexdigest())


def timed_call(eng: Engine, fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = eng.call(fn).result()
    return time.perf_counter() - t0, result


def bench_map(eng: Engine, doc_tokens: int, decode_tokens: int, repeat: int, cold_too: bool) -> None:
    attachment = document(eng.tokenizer, doc_tokens)
    composed = compose_message("What is the vault code?", [attachment])
    prompt = list(eng.tokenizer.chat_ids([{"role": "user", "content": composed.text}]))
    passages = passages_in_prompt(eng.tokenizer, prompt, composed, [attachment])
    greedy = SamplerSettings(temperature=0)

    def answer() -> Any:
        return eng.complete(GenerationRequest(prompt_ids=tuple(prompt), sampler=greedy,
                                              max_new_tokens=decode_tokens, ignore_eos=True))

    first = answer()  # the prompt's prefill
    ids = prompt + list(first.token_ids)
    position = len(prompt) + min(4, len(first.token_ids) - 1)  # one answer token
    print(f"  document: {len(passages)} passages, prompt {len(prompt):,} tokens, answer {first.text[:60]!r}")

    def one_map(b: Any) -> Any:
        return attention_map(b, ids, [position], passages)

    # Each answer leaves prompt + answer in the cache, as after the window's answer. Decode speed is compared in
    # pairs adjacent in time (the answer before a map, the one after it): the threads llama.cpp is given follow
    # the cores free at the time, so figures minutes apart on a shared machine differ by more than any effect.
    before = [answer().decode_tokens_per_s]  # the first: before any map
    first_s, amap = timed_call(eng, one_map)
    after = [answer().decode_tokens_per_s]
    warm = []
    for _ in range(repeat):
        before.append(answer().decode_tokens_per_s)
        warm.append(timed_call(eng, one_map)[0])
        after.append(answer().decode_tokens_per_s)
    cold = ""
    if cold_too:
        eng.call(lambda b: b.trim_cache(0)).result()
        cold = f"; cold (whole prompt run) {timed_call(eng, one_map)[0]:.2f} s"
    print("  top passages: " + ", ".join(f"{p.label} {share:.0%}" for p, share in amap.top(3)))
    print(f"  first map (+ head read) {first_s:.2f} s{cold}")
    print("  decode tok/s, before and after each map: "
          + ", ".join(f"{b:.1f}/{a:.1f}" for b, a in zip(before, after)))
    print(f"attention_map_s={min(warm):.3f}")
    print(f"decode_ratio_no_map={statistics.median(a / b for b, a in zip(before, after)):.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model spec (default: the default model)")
    p.add_argument("--doc-tokens", type=int, default=4000)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="also a map with the cache emptied (the whole prompt runs)")
    args = p.parse_args()
    with Engine.load(args.model) as eng:
        info = eng.info
        print(f"{info.name} ({info.backend}, {info.device})")
        print(f"attach_100_pages_s={bench_attach(eng, args.repeat):.3f}")
        bench_map(eng, args.doc_tokens, args.decode_tokens, args.repeat, args.cold)


if __name__ == "__main__":
    main()
