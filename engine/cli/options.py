"""The options every model command shares, under llama.cpp's names and short flags (`-m`, `-c`, `-t`, `-tb`,
`-ngl`, `-b`, `-sys`, `--chat-template-file`), our older long names kept as aliases.

Prefixes are never guessed (`allow_abbrev=False`): `--temp` is llama.cpp's temperature, not a prefix of
something else, and a later option can never change what an existing command line means.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from engine.backends import select
from engine.cli.sampling_args import add_sampler_flags

EXIT_USAGE = 2
USER_BACKENDS = select.USER_BACKENDS  # the backend table's names a user picks from (not the mock, which is for tests)
RANK_HELP = "rank 1 is the model's most likely token"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong, where to look) instead of the usage block,
    and an option is only ever its whole name (no prefix abbreviations)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # argparse.ArgumentParser's own (many) parameters
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Which model, where it runs, and how it is loaded (engine.runtime_settings)."""
    p.add_argument("-m", "--model", default=None,
                   help="a model folder, a .gguf file, a hub id or a server URL http://host:port/v1[#model] "
                        "(default: SmolLM2-135M-Instruct)")
    p.add_argument("--backend", default=select.AUTO, choices=USER_BACKENDS,
                   help=f"runtime (default: auto). {select.backend_help()}")
    p.add_argument("--device", default=None, help="torch device: cpu, cuda, cuda:N, mps (default: CUDA when usable, else cpu)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    p.add_argument("--trust-remote-code", action="store_true", help="run model code shipped in the model folder")
    p.add_argument("--offload", default=None, metavar="POLICY",
                   help='torch: stream weights, e.g. "weights=0,50 cache=100" (GPU%%,CPU%%; disk = rest) or "auto"')
    p.add_argument("-c", "--ctx-size", "--n-ctx", dest="n_ctx", type=int, default=None, metavar="N",
                   help="llamacpp: the context to allocate (default: the file's, lowered if its KV cache would not fit in memory)")
    p.add_argument("-t", "--threads", dest="n_threads", type=int, default=None, metavar="N",
                   help="llamacpp, torch on the CPU: CPU threads (default: chosen for each answer from the cores free at that moment: "
                        "every physical core on an idle machine, fewer beside busy programs)")
    p.add_argument("-tb", "--threads-batch", dest="n_threads_batch", type=int, default=None, metavar="N",
                   help="llamacpp: CPU threads while reading the prompt (default: as --threads)")
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", type=int, default=None, metavar="N",
                   help="llamacpp: layers on the GPU, -1 for all (default: all on a GPU build; see also --offload)")
    p.add_argument("--chat-template", default=None, metavar="NAME|TEMPLATE",
                   help="render chats with this template instead of the model's own: a built-in (chatml, llama3, "
                        "gemma, mistral, phi3, transcript) or Jinja template text, as llama.cpp's --chat-template "
                        "(a file's path is read too)")
    p.add_argument("--chat-template-file", default=None, metavar="FILE", help="as --chat-template, read from a Jinja file")
    batch_help = "llamacpp: prompt tokens per model call (default: 512)"
    try:
        p.add_argument("-b", "--batch-size", "--n-batch", dest="n_batch", type=int, default=None, metavar="N", help=batch_help)
    except argparse.ArgumentError:  # `batch` has its own --batch-size (prompts per batch)
        p.add_argument("--n-batch", dest="n_batch", type=int, default=None, metavar="N", help=batch_help)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The sampler, the answer's length and stops, the system prompt and what is printed (generate, chat)."""
    add_sampler_flags(p)
    p.add_argument("-sys", "--system-prompt", "--system", dest="system", default=None,
                   help="system prompt (chat; generate --chat)")
    p.add_argument("-sysf", "--system-prompt-file", "--system-file", dest="system_file", default=None, metavar="FILE",
                   help="read the system prompt from a UTF-8 file (its final newline is dropped)")
    p.add_argument("--show-probs", action="store_true",
                   help=f"print every token with its probability, rank ({RANK_HELP}) and top alternatives")
    p.add_argument("--top-n", type=int, default=None, help="alternatives shown with --show-probs (default: 5)")
    p.add_argument("--server-sampling", action="store_true",
                   help="a model on a server (--model http://host:port/v1): let the server sample (streaming) "
                        "instead of sampling here from its top-N log-probs")


def add_tool_args(p: argparse.ArgumentParser) -> None:
    """--tools FILE (OpenAI's tools list) and --tool-choice (generate, chat; docs/tools.md)."""
    p.add_argument("--tools", default=None, metavar="FILE",
                   help="offer the functions in this JSON file (an OpenAI-style tools list, or an object with a "
                        '"tools" list) and print each call the model makes with its confidence (generate: implies --chat)')
    p.add_argument("--tool-choice", default=None, metavar="auto|required|none|NAME",
                   help="with --tools (with --mcp-config: each turn's first answer): may call (auto, the default), "
                        "must call (required), must not (none), or must call the tool NAME")
    from engine.cli.mcp_args import add_mcp_args

    add_mcp_args(p)
