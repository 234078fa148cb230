"""Device backends behind one interface (see base.py). Vendor packages load only when chosen."""

from __future__ import annotations

from ..errors import OmniTTSError
from .base import Backend


def get_backend(name: str, eager: bool = False) -> Backend:
    """`cpu` (eager), `cuda` (CUDA graphs) or `npu` (Ascend NPU graphs; imports torch_npu)."""
    if name == "cpu":
        return Backend(eager=True)
    if name == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise OmniTTSError("--device cuda: no CUDA device is visible to torch")
        from .cuda import CudaBackend

        return CudaBackend(eager=eager)
    if name == "npu":
        from .npu import NpuBackend

        return NpuBackend(eager=eager)
    raise OmniTTSError(f"--device {name!r}: choose cpu, cuda or npu")
