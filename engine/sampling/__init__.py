"""Sampling: settings, the stage functions, and the chain that picks tokens.

One numpy implementation for every backend; see `engine.sampling.chain` for
the default stage order and why.
"""

from engine.sampling.chain import SamplerChain
from engine.sampling.pick import Choice, Pick, StageStats
from engine.sampling.settings import DEFAULT_ORDER, STAGE_NAMES, SamplerSettings

__all__ = ["DEFAULT_ORDER", "STAGE_NAMES", "Choice", "Pick", "SamplerChain", "SamplerSettings", "StageStats"]
