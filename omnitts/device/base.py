"""The one interface between the engine and a device: run frames, copy results to the host.

A backend provides three things:
  - `frame_steps(...)`: something whose `run(batch, span)` advances slots 0..batch-1 by one frame,
    either by calling the runner eagerly or by replaying a graph captured for a batch bucket;
  - `to_host(tensor)`: start a device-to-host copy and return a handle whose `result()` waits for it;
  - `predictor_attention()`: None (the code predictor's growing frame cache with torch's sdpa), or
    an attention kernel that the runner runs over a fixed-shape predictor cache (NPU).
Graph bookkeeping shared by every graph backend (buckets, padding rows, capture order, one memory
pool) lives here; a backend only says how to make, capture and replay one graph.
"""

from __future__ import annotations

import os

import numpy as np
import torch


class Transfer:
    """A finished host copy (CPU: the copy is synchronous)."""

    def __init__(self, array: np.ndarray):
        self._array = array

    def result(self) -> np.ndarray:
        return self._array


class EagerSteps:
    """Frames run as ordinary eager calls, attending only to the positions in use."""

    def __init__(self, runner):
        self.runner = runner

    def run(self, batch: int, span: int) -> None:
        self.runner.frame(batch, span)


def buckets(max_batch: int, sizes=None) -> list[int]:
    """Batch sizes that get a graph: `sizes` (default 1, 2, 4, ...) below max_batch, and max_batch itself."""
    if sizes is None:
        sizes, size = [], 1
        while size < max_batch:
            sizes.append(size)
            size *= 2
    return sorted({int(s) for s in sizes if 0 < s < max_batch}) + [max_batch]


class GraphSteps:
    """One captured whole-frame graph per batch bucket; a batch runs in the smallest bucket that fits.

    Rows beyond the real batch are padding: they compute on whatever their slots hold and their
    outputs are never read. Graphs attend over all `max_positions` (shapes must be static); the mask
    hides unused positions. The largest bucket is captured first so smaller ones reuse its pool.
    """

    def __init__(self, backend: "Backend", runner, max_batch: int, max_positions: int,
                 state: list[torch.Tensor], output: torch.Tensor, sizes=None):
        self.backend = backend
        self.max_positions = max_positions
        self.sizes = buckets(max_batch, sizes)
        self.graphs = {}
        pool = backend.graph_pool()
        for size in reversed(self.sizes):
            self.graphs[size] = backend.capture(lambda size=size: runner.frame(size, max_positions), pool, state, output)

    def bucket(self, batch: int) -> int:
        return next(size for size in self.sizes if size >= batch)

    def run(self, batch: int, span: int) -> None:
        self.graphs[self.bucket(batch)].replay()


class Backend:
    """Eager CPU behaviour; graph backends override `capture` and `graph_pool`, copies override `to_host`."""

    name = "cpu"
    supports_graphs = False

    def __init__(self, eager: bool = False):
        self.eager = eager or os.environ.get("OMNITTS_EAGER") == "1" or not self.supports_graphs

    @property
    def device(self) -> torch.device:
        return torch.device(self.name)

    def frame_steps(self, runner, max_batch: int, max_positions: int, state: list[torch.Tensor],
                    output: torch.Tensor, graph_buckets=None):
        """How frames run: eagerly, or as graphs over `state` (stable tensors) writing `output`.

        `graph_buckets`: batch sizes to capture (None: powers of two); max_batch is always one.
        """
        if self.eager:
            return EagerSteps(runner)
        return GraphSteps(self, runner, max_batch, max_positions, state, output, graph_buckets)

    def to_host(self, tensor: torch.Tensor) -> Transfer:
        return Transfer(tensor.detach().cpu().numpy().copy())

    def predictor_attention(self):
        """None, or a kernel `(q, k, v, mask, causal) -> out` (see models.layers.sdpa_attention) that
        asks for the code predictor's fixed-shape frame cache (all G positions under a mask)."""
        return None

    def graph_pool(self):
        return None

    def capture(self, fn, pool, state: list[torch.Tensor], output: torch.Tensor):
        raise NotImplementedError(f"{self.name} has no graph support")
