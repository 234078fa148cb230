"""Ascend NPUs via torch_npu: NPU graphs and deferred copies, mirroring the CUDA backend.

`torch_npu` is imported only when this backend is chosen (it breaks `import torch` on machines without
the CANN toolkit). Written against torch_npu's public API (torch.npu.NPUGraph / torch.npu.graph /
torch.npu.Event); it has not run on real hardware in this project yet (no NPU on our machines).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import OmniTTSError
from .base import Backend


def import_torch_npu():
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:  # ImportError, or the CANN toolkit's own errors
        raise OmniTTSError(
            f"--device npu needs torch_npu and the Ascend CANN toolkit ({type(exc).__name__}: {exc}); "
            "install them (pip install 'omnitts[npu]', then source CANN's set_env.sh) or use --device cpu"
        ) from None
    if not torch.npu.is_available():
        raise OmniTTSError("--device npu: torch_npu is installed but no NPU is visible")


class NpuTransfer:
    def __init__(self, tensor: torch.Tensor):
        self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self.host.copy_(tensor, non_blocking=True)
        self.event = torch.npu.Event()
        self.event.record()

    def result(self) -> np.ndarray:
        self.event.synchronize()
        return self.host.numpy().copy()


class NpuGraph:
    def __init__(self, graph):
        self.graph = graph

    def replay(self) -> None:
        self.graph.replay()


class NpuBackend(Backend):
    name = "npu"
    supports_graphs = True

    def __init__(self, eager: bool = False):
        import_torch_npu()
        super().__init__(eager=eager)

    def to_host(self, tensor: torch.Tensor) -> NpuTransfer:
        return NpuTransfer(tensor)

    def graph_pool(self):
        return torch.npu.graph_pool_handle()

    def capture(self, fn, pool, state, output) -> NpuGraph:
        side = torch.npu.Stream()
        side.wait_stream(torch.npu.current_stream())
        saved = [t.clone() for t in state]
        with torch.npu.stream(side):
            for _ in range(2):
                fn()
        torch.npu.current_stream().wait_stream(side)
        for tensor, copy in zip(state, saved):
            tensor.copy_(copy)
        graph = torch.npu.NPUGraph()
        with torch.npu.graph(graph, pool=pool):
            fn()
        return NpuGraph(graph)
