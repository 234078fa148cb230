"""The one interface between the engine and a device: run frames, copy results to the host.

A backend provides three things:
  - `frame_steps(...)`: something whose `run(batch, span)` advances slots 0..batch-1 by one frame,
    either by calling the runner eagerly or by replaying a graph captured for a (batch, span) bucket;
  - `to_host(tensor)`: start a device-to-host copy and return a handle whose `result()` waits for it;
  - `predictor_attention()`: None (the code predictor's growing frame cache with torch's sdpa), or
    an attention kernel that the runner runs over a fixed-shape predictor cache (NPU).
Graph bookkeeping shared by every graph backend (batch and span buckets, padding rows, capture
when first needed, one memory pool) lives here; a backend only says how to make, capture and replay one graph.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings

import numpy as np
import torch

from ..models.codec_stream import TILE_FRAMES

# Eager runs of a frame before its capture: cuBLAS / attention kernels initialise and the allocator
# settles on the first call; one run does it (the capture is the second), so a graph costs two frames.
WARMUP_RUNS = 1


class Transfer:
    """A finished host copy (CPU: the copy is synchronous)."""

    def __init__(self, array: np.ndarray):
        self._array = array

    def result(self) -> np.ndarray:
        return self._array


class EagerSteps:
    """Frames run as ordinary eager calls, attending only to the positions in use; with `full_batch` (a
    number of rows), every frame runs that many rows, the ones past the live batch padding as in a graph."""

    captures = warmup_frames = 0
    capture_seconds = 0.0

    def __init__(self, runner, full_batch: int | None = None):
        self.runner, self.full_batch = runner, full_batch

    def run(self, batch: int, span: int) -> None:
        self.runner.frame(self.full_batch or batch, span)


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
    """Whole-frame graphs per (batch bucket, span bucket), each captured the first time a frame needs it;
    a frame replays the smallest (batch, span) graph that fits its live rows and its longest live cache.

    Rows beyond the real batch are padding: they compute on whatever their slots hold and their
    outputs are never read. Shapes inside a graph are static, so a graph attends over its span
    bucket's positions and the mask hides the ones not yet written; the span buckets make that work
    scale with the live length (a 100-position batch reads the first 256 positions, 1/16 of 4096).

    Captured when first needed, not all at start-up: the defaults for max_batch 64 and 4096 positions
    are 7 x 5 = 35 buckets per sampling plan, most of which a run of short texts never uses, and each
    capture costs two frames (one warm-up, the capture). A frame that needs a new bucket captures that
    one alone (the running rows wait for at most one capture per step), and the warm-up saves and
    restores only the slots' small per-row state (`restore`), never the K/V cache. All graphs of an
    engine share its one memory pool (`pool`); they never run concurrently (one stream, one frame at a
    time), so a graph may reuse blocks another left free. `captures`, `warmup_frames` and
    `capture_seconds` say what the laziness cost.

    A device that refuses a capture (old CANN, stream resources, memory) makes this frame and every
    later one run eagerly, with one warning; the CPU fake raises instead (a broken graph rule is a bug).
    """

    def __init__(self, backend: "Backend", runner, max_batch: int, max_positions: int, restore: list[torch.Tensor],
                 output: torch.Tensor, sizes=None, spans=None, pool=None, inputs: list[torch.Tensor] | None = None,
                 full_batch: bool = False):
        self.backend, self.runner = backend, runner
        self.full_batch = full_batch  # a frame run eagerly (capture refused) runs its bucket's rows too
        self.restore, self.output, self.inputs = restore, output, inputs
        self.pool = pool if pool is not None else backend.graph_pool()
        self.max_positions = max_positions
        self.sizes = buckets(max_batch, sizes)
        self.spans = span_buckets(max_positions, spans)
        self.graphs = {}
        self.captures = 0
        self.warmup_frames = 0  # eager frames run to warm a graph up (its capture not counted)
        self.capture_seconds = 0.0

    def bucket(self, batch: int, span: int) -> tuple[int, int]:
        """The smallest (batch, span) bucket covering `batch` rows attending over `span` positions."""
        assert batch <= self.sizes[-1] and span <= self.spans[-1], (batch, span)
        return (next(size for size in self.sizes if size >= batch), next(s for s in self.spans if s >= span))

    def run(self, batch: int, span: int) -> None:
        key = self.bucket(batch, span)
        graph = self.graphs.get(key)
        if graph is None and not self.backend.eager:  # eager: an earlier capture failed (this plan's or another's)
            graph = self._capture(*key)
        if graph is None:  # refused, now or earlier: this frame runs eagerly
            self.runner.frame(key[0] if self.full_batch else batch, span)
        else:
            graph.replay()

    def _capture(self, size: int, span: int):
        """The graph of bucket (size, span), captured now; None if the device refused (frames go eager)."""
        runner = self.runner
        started = time.perf_counter()
        try:
            graph = self.backend.capture(lambda: runner.frame(size, span), self.pool, self.restore, self.output,
                                         self.inputs)
        except RuntimeError as error:
            if not self.backend.capture_fallback:
                raise
            self.backend.refused(error)
            return None
        finally:
            self.warmup_frames += WARMUP_RUNS
            self.capture_seconds += time.perf_counter() - started
        self.captures += 1
        self.graphs[size, span] = graph
        return graph


class CallGraphs:
    """Graphs of fixed-shape calls other than frames (the streamed codec's, one per (rows, frames)), captured
    when a call shape is first needed, into one memory pool of their own (they never run concurrently).

    A device that refuses a capture makes that call and every later one run eagerly, with one warning (the
    frames keep their own graphs); the CPU fake raises instead. `captures` and `capture_seconds` say what
    capturing cost.

    `own_stream`: the calls' device work (`on_stream()`) goes to a stream of its own, beside the frames'
    (whose small kernels leave most of the device idle), instead of queueing behind them. The caller then
    does ALL its work on the state these calls read and write inside `on_stream()` (one stream orders it);
    what comes back to the host does so through copies made there (their events are that stream's).
    """

    def __init__(self, backend: "Backend", what: str = "codec", own_stream: bool = False):
        self.backend, self.what = backend, what
        self.pool = backend.graph_pool()
        self.stream = backend.api.Stream() if own_stream else None
        self.refused = False
        self.captures = 0
        self.capture_seconds = 0.0

    def on_stream(self):
        """A context in which device work goes to the calls' own stream (or stays where it is)."""
        return self.backend.api.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def capture(self, fn, inputs: list[torch.Tensor], output: torch.Tensor):
        """`fn`'s graph (after one warm-up run), or None: run `fn` eagerly. `fn` must leave the state it reads
        as the real call would find it when run on the inputs as they are now (a warm-up really runs)."""
        if self.refused:
            return None
        started = time.perf_counter()
        try:
            graph = self.backend.capture(fn, self.pool, [], output, inputs)
        except RuntimeError as error:
            if not self.backend.capture_fallback:
                raise
            warnings.warn(f"omnitts: {self.backend.name} graph capture of a {self.what} call failed "
                          f"({type(error).__name__}: {error}); {self.what} calls run eagerly from here on",
                          RuntimeWarning, stacklevel=3)
            self.refused = True
            return None
        finally:
            self.capture_seconds += time.perf_counter() - started
        self.captures += 1
        return graph


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
    # Pumps a ready codec chunk may wait for other streams to share its call (CodecStreams' `gather`):
    # 0 on the CPU, where a call costs about what its rows do.
    codec_gather = 0
    # Streamed codec calls of a few fixed shapes (CodecStreams' `fixed`): what graphs need. Off on the CPU,
    # where every call keeps the reference decode's own shape (bitwise the whole-utterance decode).
    codec_fixed_shapes = False

    def __init__(self, eager: bool = False):
        self.eager = eager or os.environ.get("OMNITTS_EAGER") == "1" or not self.supports_graphs

    @property
    def device(self) -> torch.device:
        return torch.device(self.name)

    def frame_steps(self, runner, max_batch: int, max_positions: int, restore: list[torch.Tensor],
                    output: torch.Tensor, graph_buckets=None, span_buckets=None, pool=None,
                    inputs: list[torch.Tensor] | None = None, full_batch: bool = False):
        """How frames run: eagerly, or as graphs (captured when first needed) writing `output`.

        `restore`: the state a frame overwrites that a graph's warm-up must leave as it found it;
        `inputs`: every tensor the frames read (stable addresses; default `restore`);
        `graph_buckets`: batch sizes given a graph (None: powers of two); max_batch is always one;
        `span_buckets`: attention spans given a graph (None: 256, 512, ...); max_positions is always one;
        `pool`: the memory pool the graphs share (None: a new one; an engine passes its own, one for all
        its sampling plans);
        `full_batch`: every frame runs max_batch rows (eager; graphs: one batch bucket, max_batch).
        """
        if self.eager:
            return EagerSteps(runner, max_batch if full_batch else None)
        return GraphSteps(self, runner, max_batch, max_positions, restore, output,
                          () if full_batch else graph_buckets, span_buckets, pool, inputs, full_batch)

    def pads_prefill(self, dtype: torch.dtype) -> bool:
        """Whether prompts are prefilled padded to a few fixed lengths (`engine.runner.Prefills`), so each
        length can be a graph: never on the CPU (its prefill keeps each prompt's own shape)."""
        return False

    def call_graphs(self, what: str = "codec", own_stream: bool | None = None) -> CallGraphs | None:
        """Graphs for fixed-shape calls outside the frames (`CallGraphs`), or None where calls run eagerly;
        on a stream of their own (`own_stream` None: unless OMNITTS_CODEC_STREAM=0), else behind the frames."""
        if self.eager:
            return None
        if own_stream is None:
            own_stream = os.environ.get("OMNITTS_CODEC_STREAM", "1") != "0"
        return CallGraphs(self, what, own_stream=own_stream)

    def refused(self, error: Exception) -> None:
        """A capture failed on the device: warn once, and run every later frame eagerly."""
        warnings.warn(f"omnitts: {self.name} graph capture failed ({type(error).__name__}: {error}); frames run "
                      "eagerly from here on (slower; --eager skips the attempt)", RuntimeWarning, stacklevel=3)
        self.eager = True  # one warning: later buckets and sampling plans go straight to eager frames

    def to_host(self, tensor: torch.Tensor) -> Transfer:
        return Transfer(tensor.detach().cpu().numpy().copy())

    def broken(self) -> str | None:
        """Asked after a fault: None if the device still computes, else what it says. The CPU does not
        break this way (a fault there is the item's or the code's)."""
        return None

    def free_memory(self) -> int | None:
        """Bytes the device can still allocate (None: unknown). The CPU's is Linux's MemAvailable: free
        memory and what the kernel can reclaim (file caches), without swapping."""
        try:
            with open("/proc/meminfo") as handle:
                for line in handle:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return None

    def predictor_attention(self):
        """None, or a kernel `(q, k, v, mask, causal) -> out` (see models.layers.sdpa_attention) that
        asks for the code predictor's fixed-shape frame cache (all G positions under a mask)."""
        return None

    def graph_pool(self):
        return None

    def capture(self, fn, pool, restore: list[torch.Tensor], output: torch.Tensor, inputs=None):
        raise NotImplementedError(f"{self.name} has no graph support")
