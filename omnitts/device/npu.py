"""Ascend NPUs via torch_npu: NPU graphs and deferred copies, as the CUDA backend does.

`torch_npu` is imported only when this backend is chosen (without the CANN toolkit it breaks
`import torch`). Not yet run on real hardware in this project (no NPU on our machines).
"""

from __future__ import annotations

import torch

from ..errors import OmniTTSError
from .accelerator import AcceleratorBackend


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


class NpuBackend(AcceleratorBackend):
    name = "npu"

    def __init__(self, eager: bool = False):
        import_torch_npu()
        super().__init__(eager=eager)

    def new_graph(self, fn, state, output):
        return torch.npu.NPUGraph()
