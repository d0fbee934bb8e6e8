"""Research APIs: batch generation, cached next-token logprobs, sampling, beam search."""

from engine.research.beam import BeamResult
from engine.research.lm import LanguageModel

__all__ = ["BeamResult", "LanguageModel"]
