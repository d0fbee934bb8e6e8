"""`logitlab-cli` / `python -m engine`: the parser and commands (main.py), checked input (input.py),
the batch and beam commands (research.py), compare and score (experiments.py)."""

from engine.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
