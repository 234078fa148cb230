"""Continuous-batching engine: scheduler, slot state, model runner and the step loop."""

from .engine import Engine, EngineConfig, plan
from .scheduler import Sequence

__all__ = ["Engine", "EngineConfig", "Sequence", "plan"]
