"""Steering: control vectors added to a model's residual stream, trained, loaded, applied and inspected.

The pieces, one file each:

- `SteeringVector` (vector.py): one direction per decoder layer, for a model of a given layer count and width;
  identified in records by name and content hash.
- `Steering` (settings.py): vectors with a strength each and a layer range; frozen, checks itself, rides on
  `GenerationRequest.steering` and is recorded with the answer (`to_dict`).
- `load_vector` / `save_vector` (gguf_file.py): llama.cpp's control-vector GGUF, both ways.
- `PairSet`, `builtin_pair_sets`, `read_pair_set` (pairs.py) and `train_vector` (train.py): repeng's method.
- `steering_effect` / `unsteered_shadow` (effect.py): what steering did to a token, and to every token of an answer.
- `steer_for_request` (apply.py): the decode loop's one call that applies a request's steering (or refuses it).

Backends implement `engine.capabilities.Steerable` (and `ResidualStates` for training) in their own packages.
"""

from engine.steering.apply import can_steer, steer_for_request
from engine.steering.effect import SteeringEffect, SteeringShadow, TokenShift, steering_effect, unsteered_shadow
from engine.steering.errors import SteeringError
from engine.steering.gguf_file import load_vector, save_vector
from engine.steering.pairs import PairSet, builtin_pair_sets, read_pair_files, read_pair_set, read_pairs_jsonl
from engine.steering.settings import NO_STEERING, STRENGTH_LIMIT, Steering, SteeringEntry
from engine.steering.shape import ResidualShape
from engine.steering.train import METHODS, train_vector
from engine.steering.vector import SteeringVector

__all__ = [
    "METHODS",
    "NO_STEERING",
    "STRENGTH_LIMIT",
    "PairSet",
    "ResidualShape",
    "Steering",
    "SteeringEffect",
    "SteeringEntry",
    "SteeringError",
    "SteeringShadow",
    "SteeringVector",
    "TokenShift",
    "builtin_pair_sets",
    "can_steer",
    "load_vector",
    "read_pair_files",
    "read_pair_set",
    "read_pairs_jsonl",
    "save_vector",
    "steer_for_request",
    "steering_effect",
    "train_vector",
    "unsteered_shadow",
]
