"""`logitlab-cli` / `python -m engine`: the parser and commands (main.py), the shared options under llama.cpp's
names (options.py), the sampler flags and --settings-json (sampling_args.py), checked input (input.py),
the batch and beam commands (research.py), compare and score (experiments.py), `info`'s chat template line
(info.py)."""

from engine.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
