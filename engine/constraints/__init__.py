"""Constrained generation: the answer must match a JSON schema, a regex, a grammar or a choice list.

`Constraint` is the spec (validated when made: a bad schema is one error
before any model runs); `start_run` makes one answer's matcher over the
model's own vocabulary (`ll_tokenizer`); the sampler's `grammar` stage
(`engine.sampling.grammar`) applies its mask and records what it removed.
Built on llguidance.
"""

from engine.constraints.matcher import ConstraintRun, start_run
from engine.constraints.spec import KIND_LABELS, KINDS, Constraint, ConstraintError
from engine.constraints.vocabulary import ll_tokenizer

__all__ = ["KINDS", "KIND_LABELS", "Constraint", "ConstraintError", "ConstraintRun", "ll_tokenizer", "start_run"]
