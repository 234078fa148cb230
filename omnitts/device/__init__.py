"""Device backends behind one interface (see base.py). Vendor packages load only when chosen."""

from __future__ import annotations

import os
import warnings

import torch

from ..errors import OmniTTSError
from ..models.layers import fuse_projections, grouped_decode_attention
from ..models.loader import Models
from .base import Backend


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that did not fit: torch's OutOfMemoryError (CUDA), the CPU allocator's
    and torch_npu's RuntimeErrors (their messages), or Python's MemoryError."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


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


def stores_linears(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `device` wants the talker's linear weights left as stored at load (it repacks them)."""
    if device.type == "cpu":
        from .cpu import stores_linears as cpu_stores

        return cpu_stores(dtype)
    return False


def prepare_weights(models: Models, device: torch.device, dtype: torch.dtype, codec_dtype: torch.dtype,
                    max_batch: int = 1) -> None:
    """Lay freshly loaded `models` out for `device`, in place (vLLM's `process_weights_after_loading`).

    Every device merges the q/k/v and gate/up projections (fewer, larger matrix products); the CPU also
    packs weights, swaps in its native kernels and rewrites the codec's convolutions (device/cpu.py);
    accelerators give the talker the decode attention their fused masked kernels take
    (`layers.grouped_decode_attention`); CUDA gets the fused ops of device/fused.py (one Triton kernel each
    where torch runs several) unless `fused.wanted` says no (float32, the parity runs, keeps torch's
    arithmetic; `OMNITTS_FUSED` decides).
    """
    if device.type == "cpu":
        from .cpu import prepare_weights as prepare_cpu

        prepare_cpu(models, dtype, codec_dtype, max_batch)
        return
    from .fused import wanted

    prepare_generic(models, fused=device.type == "cuda" and wanted(dtype))
    if device.type == "cuda":
        no_cudnn_attention()
    if dtype == torch.float32:
        exact_float32(device)


def no_cudnn_attention() -> None:
    """CUDA's sdpa stops choosing cuDNN attention, process-wide (`OMNITTS_CUDNN_ATTENTION=1` keeps it).

    cuDNN attention builds an execution plan for each new shape on the host, and omnitts' shapes keep
    changing where frames run eagerly: each prompt's prefill (its own length), each graph bucket's
    warm-up and capture (batch x span), the codec's windows. On an H200 (torch 2.11, 1.7B at max batch
    64, 192 lines) the first 8,422 sdpa calls of a run, nearly all eager, took 10.6 s on the host (1.3 ms
    each), most of graph capture's 9.3 s. Without it a masked call takes the memory-efficient kernel
    (the grouped decode attention is arranged for it), an unmasked one flash.
    """
    if os.environ.get("OMNITTS_CUDNN_ATTENTION", "0") != "1" and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


def prepare_generic(models: Models, fused: bool) -> None:
    """The preparation of devices without a layout of their own: q/k/v and gate/up merged, and with
    `fused` the talker's norms, residual adds, q/k norm + rotary and SwiGLU taken by device/fused.py's ops.
    On CPU tensors this is the GPU path's stand-in that testing/opcount.py counts."""
    fuse_projections(models.model.talker)
    fuse_projections(models.codec)
    # The talker's decode attends with a per-row mask over the slot cache: as plain multi-head attention the
    # fused masked kernel takes it (with enable_gqa, CUDA's sdpa falls back to its math kernel). The code
    # predictor's one-query steps too (no mask there, but torch 2.4 has no enable_gqa: K/V would be repeated).
    talker = models.model.talker
    talker.model.attend = talker.code_predictor.model.attend = grouped_decode_attention
    if fused:
        _use_checked_fused_ops(models.model.talker)


def _use_checked_fused_ops(talker) -> None:
    """device/fused.py's ops into `talker`; on a GPU only once `fused.self_check` passed there (the Triton
    kernels' first compile and run): a failure is one warning and torch's kernels, never a failed run."""
    from .fused import self_check, use_fused_ops

    device = talker.model.codec_embedding.weight.device
    failed = self_check(device, talker.dtype) if device.type == "cuda" else None
    if failed is not None:
        warnings.warn(f"omnitts: the fused CUDA ops failed their check at load ({failed}); frames run torch's "
                      "kernels (more launches per frame; OMNITTS_FUSED=0 skips them)", RuntimeWarning, stacklevel=3)
        return
    use_fused_ops(talker)


def exact_float32(device: torch.device) -> None:
    """float32 means float32 arithmetic (the parity runs): matrix products and convolutions on `device`
    stop using TF32 (CUDA; torch allows it for cuDNN convolutions by default) or HF32 (Ascend; torch_npu
    allows it for convolutions by default). Process-wide, as these switches are; bfloat16 runs keep the
    defaults (their float32 codec included)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    elif device.type == "npu":
        npu = getattr(torch, "npu", None)  # registered by torch_npu
        for switch in ("matmul", "conv"):
            settings = getattr(npu, switch, None)
            if settings is not None and hasattr(settings, "allow_hf32"):
                settings.allow_hf32 = False


def make_deterministic(talker, device: torch.device) -> None:
    """Deterministic mode for `talker` (`omnitts.load(deterministic=True)`, `--deterministic`): on CUDA, a
    line's codes stop depending on the lines decoded beside it. The engine then runs every frame at its full
    batch (fixed matrix shapes, so cuBLAS and torch's reductions take the same kernels every frame) and the
    codec one stream per call; here the decoder stacks' decode attention becomes
    `fused.deterministic_attention` (each row sums its own keys, in an order that no span bucket and no batch
    mate changes), after its Triton kernel proved that on this GPU, and cuDNN takes deterministic algorithms.

    The CPU's frames are batch-invariant already (nothing changes here; the pipeline still decodes one codec
    stream per call); an NPU has no such kernels here (OmniTTSError). Raises OmniTTSError if the kernel fails
    its check (no silent fallback: the mode is a promise).
    """
    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise OmniTTSError(f"--deterministic: not available on {device.type} (cuda has it; the cpu is always "
                           "deterministic)")
    from .fused import deterministic_attention, deterministic_check

    failed = deterministic_check(device, talker.dtype)
    if failed is not None:
        raise OmniTTSError(f"--deterministic: the batch-invariant attention kernel failed its check on this GPU "
                           f"({failed}); run without --deterministic")
    talker.model.attend = talker.code_predictor.model.attend = deterministic_attention
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
