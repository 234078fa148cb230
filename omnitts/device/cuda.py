"""NVIDIA GPUs: whole-frame CUDA graphs, pinned host buffers and events for deferred copies.

Written against the public torch.cuda API; it has not run on real hardware in this project yet
(no GPU on our machines). Capture: warm up on a side stream, capture the largest bucket first and
share one memory pool, error on any host sync while capturing (sync debug mode).
"""

from __future__ import annotations

import numpy as np
import torch

from .base import Backend


class PinnedTransfer:
    """A non-blocking device-to-host copy into a pinned buffer, completed when its event fires."""

    def __init__(self, tensor: torch.Tensor):
        # A fresh pinned buffer per copy: a reused staging buffer must never be handed out as a view.
        self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self.host.copy_(tensor, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()

    def result(self) -> np.ndarray:
        self.event.synchronize()
        return self.host.numpy().copy()


class CudaGraph:
    def __init__(self, graph):
        self.graph = graph

    def replay(self) -> None:
        self.graph.replay()


class CudaBackend(Backend):
    name = "cuda"
    supports_graphs = True

    def to_host(self, tensor: torch.Tensor) -> PinnedTransfer:
        return PinnedTransfer(tensor)

    def graph_pool(self):
        return torch.cuda.graph_pool_handle()

    def capture(self, fn, pool, state, output) -> CudaGraph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        saved = [t.clone() for t in state]
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy inits and allocator state before capture
                fn()
        torch.cuda.current_stream().wait_stream(side)
        for tensor, copy in zip(state, saved):
            tensor.copy_(copy)
        graph = torch.cuda.CUDAGraph()
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.cuda.graph(graph, pool=pool):
                fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        return CudaGraph(graph)
