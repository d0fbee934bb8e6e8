"""The torch backend's decode loop with and without `forward_during` (OverlappedForward), in turn.

    python bench/torch_overlap.py [--model SPEC] [--new-tokens 64] [--rounds 4]

With overlap the decode loop builds token t's report (top-20, entropy) while the model computes t+1 on the
backend's helper thread; without, one after the other, as before issue 49. Greedy, EOS ignored, the same prompt
as bench/decode.py; the tokens must be the same. Last line: ratio_overlap_vs_plain=X.XX (tok/s with overlap
over tok/s without; 1.00 or more: no slower).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine.decode.loop as decode_loop  # noqa: E402
from decode import PROMPT, ours  # noqa: E402  (bench/decode.py: bench/ is the script folder, first on sys.path)
from engine.backends.torch.backend import TorchBackend  # noqa: E402
from engine.quiet import quiet_third_party  # noqa: E402
from engine.sources import materialize, resolve_spec  # noqa: E402


class _NoOverlap:
    """Stands for OverlappedForward in the decode loop for the runs without overlap: no backend is one."""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    quiet_third_party()
    source = resolve_spec(args.model)
    backend = TorchBackend(materialize(source), spec=source.spec, display_name=source.name, compile_step=False)
    prompt_ids = backend.tokenizer.chat_ids([{"role": "user", "content": PROMPT}])
    overlapped = decode_loop.OverlappedForward
    ours(backend, prompt_ids, 8)  # warm-up
    on, off, same = [], [], True
    try:
        for r in range(args.rounds):
            decode_loop.OverlappedForward = overlapped
            rate, with_tokens = ours(backend, prompt_ids, args.new_tokens)
            on.append(rate)
            decode_loop.OverlappedForward = _NoOverlap  # type: ignore[misc, assignment]  # the loop's check fails
            rate, plain_tokens = ours(backend, prompt_ids, args.new_tokens)
            off.append(rate)
            same = same and with_tokens == plain_tokens
            print(f"round {r + 1}: overlap {on[-1]:.1f} tok/s, plain {off[-1]:.1f} tok/s")
    finally:
        decode_loop.OverlappedForward = overlapped
        backend.close()
    print(f"same tokens: {'yes' if same else 'NO'}")
    print(f"ratio_overlap_vs_plain={statistics.median(on) / statistics.median(off):.2f}")


if __name__ == "__main__":
    main()
