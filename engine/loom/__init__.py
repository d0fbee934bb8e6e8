"""The loom's engine side: N continuations from one prefix (batched where the model can), and step mode."""

from engine.loom.continuations import MAX_CHILDREN, MIN_CHILDREN, RowEvent, check_children, continuation_events
from engine.decode.step import StepGate, SteppedEngine

__all__ = ["MAX_CHILDREN", "MIN_CHILDREN", "RowEvent", "StepGate", "SteppedEngine", "check_children",
           "continuation_events"]
