"""The one interface between the engine and a device: run frames, copy results to the host.

A backend provides three things:
  - `frame_steps(...)`: something whose `run(batch, span)` advances slots 0..batch-1 by one frame,
    either by calling the runner eagerly or by replaying a graph captured for a (batch, span) bucket;
  - `to_host(tensor)`: start a device-to-host copy and return a handle whose `result()` waits for it;
  - `predictor_attention()`: None (the code predictor's growing frame cache with torch's sdpa), or
    an attention kernel that the runner runs over a fixed-shape predictor cache (NPU).
Graph bookkeeping shared by every graph backend (batch and span buckets, padding rows, capture
order, one memory pool) lives here; a backend only says how to make, capture and replay one graph.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import torch

from ..models.codec_stream import TILE_FRAMES


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


def _ladder(limit: int, first: int, given=None) -> list[int]:
    """`given` (default first, 2 x first, 4 x first, ...) below `limit`, sorted and unique, then `limit`."""
    if given is None:
        given, size = [], first
        while size < limit:
            given.append(size)
            size *= 2
    return sorted({int(s) for s in given if 0 < s < limit}) + [limit]


def buckets(max_batch: int, sizes=None) -> list[int]:
    """Batch sizes that get a graph: `sizes` (default 1, 2, 4, ...) below max_batch, and max_batch itself."""
    return _ladder(max_batch, 1, sizes)


def span_buckets(max_positions: int, spans=None) -> list[int]:
    """Attention spans that get a graph: `spans` (default 256, 512, 1024, ...) below max_positions,
    and max_positions itself (the cache capacity; no frame attends further)."""
    return _ladder(max_positions, 256, spans)


def frame_kv_bytes(cache, batch: int, span: int) -> int:
    """Talker K/V bytes one frame reads for `batch` rows attending over `span` positions: every layer's
    K and V views of (batch, kv_heads, span, head_dim). The byte model of the span buckets."""
    return sum(t[:batch, :, :span].numel() * t.element_size() for t in cache.tensors())


class GraphSteps:
    """One captured whole-frame graph per (batch bucket, span bucket); a frame replays the smallest
    (batch, span) graph that fits its live rows and its longest live cache.

    Rows beyond the real batch are padding: they compute on whatever their slots hold and their
    outputs are never read. Shapes inside a graph are static, so a graph attends over its span
    bucket's positions and the mask hides the ones not yet written; the span buckets make that work
    scale with the live length (a 100-position batch reads the first 256 positions, 1/16 of 4096).

    Cost: len(batch buckets) x len(span buckets) graphs (defaults for max_batch 64 and 4096
    positions: 7 x 5 = 35). The K/V cache is not copied per graph: each graph reads views of the
    one slot cache. What a graph owns is its activations, and all graphs share one memory pool,
    captured largest first, so the pool holds about the activations of the largest graph
    (max_batch rows over max_positions); smaller graphs reuse its blocks.

    Every graph is captured here, eagerly, rather than on first use: a lazy capture would stall a
    running batch mid-stream (warm-up frames plus the capture, and a clone of the slot state to undo
    the warm-up, the whole K/V cache included), would capture in whatever order traffic dictates
    (a smaller graph first fragments the shared pool), and would surface an out-of-memory or a
    graph-rule error hours into a run instead of at start-up. The price is start-up time:
    three frame runs per graph (two warm-ups and the capture).
    """

    def __init__(self, backend: "Backend", runner, max_batch: int, max_positions: int,
                 state: list[torch.Tensor], output: torch.Tensor, sizes=None, spans=None):
        self.backend = backend
        self.max_positions = max_positions
        self.sizes = buckets(max_batch, sizes)
        self.spans = span_buckets(max_positions, spans)
        self.graphs = {}
        pool = backend.graph_pool()
        for size in reversed(self.sizes):  # largest first: smaller graphs reuse the pool's blocks
            for span in reversed(self.spans):
                fn = lambda size=size, span=span: runner.frame(size, span)  # noqa: E731
                self.graphs[size, span] = backend.capture(fn, pool, state, output)

    def bucket(self, batch: int, span: int) -> tuple[int, int]:
        """The smallest captured (batch, span) covering `batch` rows attending over `span` positions."""
        assert batch <= self.sizes[-1] and span <= self.spans[-1], (batch, span)
        return (next(size for size in self.sizes if size >= batch), next(s for s in self.spans if s >= span))

    def run(self, batch: int, span: int) -> None:
        self.graphs[self.bucket(batch, span)].replay()


class Backend:
    """Eager CPU behaviour; graph backends override `capture` and `graph_pool`, copies override `to_host`."""

    name = "cpu"
    supports_graphs = False
    # A device's capture failure falls back to eager frames with one warning (the CPU fake sets this off:
    # a broken graph rule is a bug to surface, not to run around).
    capture_fallback = True
    # Streamed codec decode: frames (over all rows) per time slice of the late upsampling layers
    # (models/codec_stream.TILE_FRAMES, sized for a CPU's caches); None = one slice per call (devices
    # run a whole chunk in parallel).
    codec_tile_frames: int | None = TILE_FRAMES

    def __init__(self, eager: bool = False):
        self.eager = eager or os.environ.get("OMNITTS_EAGER") == "1" or not self.supports_graphs

    @property
    def device(self) -> torch.device:
        return torch.device(self.name)

    def frame_steps(self, runner, max_batch: int, max_positions: int, state: list[torch.Tensor],
                    output: torch.Tensor, graph_buckets=None, span_buckets=None):
        """How frames run: eagerly, or as graphs over `state` (stable tensors) writing `output`.

        `graph_buckets`: batch sizes to capture (None: powers of two); max_batch is always one.
        `span_buckets`: attention spans to capture (None: 256, 512, ...); max_positions is always one.
        """
        if self.eager:
            return EagerSteps(runner)
        try:
            return GraphSteps(self, runner, max_batch, max_positions, state, output, graph_buckets, span_buckets)
        except RuntimeError as error:  # the device refused the capture (old CANN, stream resources, memory)
            if not self.capture_fallback:
                raise
            warnings.warn(f"omnitts: {self.name} graph capture failed ({type(error).__name__}: {error}); frames run "
                          "eagerly from here on (slower; --eager skips the attempt)", RuntimeWarning, stacklevel=2)
            self.eager = True  # one warning: later sampling plans go straight to eager frames
            return EagerSteps(runner)

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
