"""Sampling: settings, the stage functions, and the chain that picks tokens.

One numpy implementation for every backend; see `engine.sampling.chain` for
the default stage order and why, and `engine.sampling.custom_stage` for a
stage of your own.
"""

from engine.sampling.chain import SamplerChain
from engine.sampling.custom_stage import CustomStage, CustomStageError
from engine.sampling.final import final_distribution
from engine.sampling.pick import Choice, Pick, StageStats
from engine.sampling.settings import DEFAULT_ORDER, STAGE_NAMES, SamplerSettings

__all__ = [
    "DEFAULT_ORDER",
    "STAGE_NAMES",
    "Choice",
    "CustomStage",
    "CustomStageError",
    "Pick",
    "SamplerChain",
    "SamplerSettings",
    "StageStats",
    "final_distribution",
]
