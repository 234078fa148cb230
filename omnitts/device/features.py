"""What this machine's processor can do, read at run time (CPUs differ between machines).

`dtype="auto"` asks for bfloat16 language models only where bfloat16 matrix products are native:
on CUDA / NPU, and on CPUs with AVX512-BF16 or AMX-BF16 (there a bf16 GEMV streams half the bytes
of float32, and bf16 GEMMs run at about 3x the float32 rate). Elsewhere bf16 is emulated and
slower than float32 (an AVX2-only machine ran the codec ~57x slower in bf16), so auto means float32.
"""

from __future__ import annotations

import functools
import platform

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo names of native bf16 dot products
REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_tile",
                  "amx_int8")


def _cpuinfo(keys: tuple[str, ...]) -> str | None:
    """The value of the first /proc/cpuinfo line whose name starts with one of `keys` (None if unknown)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith(keys):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags the kernel reports (Linux /proc/cpuinfo); empty where unknown."""
    return frozenset((_cpuinfo(("flags", "Features")) or "").split())


def cpu_model() -> str:
    return _cpuinfo(("model name",)) or platform.processor() or platform.machine()


def native_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU has native bfloat16 dot products (AVX512-BF16 or AMX-BF16)."""
    flags = cpu_flags() if flags is None else flags
    return any(flag in flags for flag in BF16_FLAGS)


def resolve_dtype(dtype: str, device: str, flags: frozenset[str] | None = None) -> str:
    """`auto` -> bfloat16 on cuda, on A2-class NPUs (float16 on older ones) and on CPUs with native bf16,
    else float32; other names unchanged."""
    if dtype != "auto":
        return dtype
    if device.split(":")[0] == "npu":
        from .npu import auto_dtype

        return auto_dtype()  # bfloat16 on A2-class parts, float16 on older ones (device/npu.py)
    if device.split(":")[0] == "cuda":
        return "bfloat16"
    return "bfloat16" if native_bf16(flags) else "float32"


def describe() -> dict:
    """CPU model, the flags that matter here and torch's kernel level: recorded with every benchmark."""
    import torch

    flags = cpu_flags()
    return {"cpu": cpu_model(), "flags": [f for f in REPORTED_FLAGS if f in flags],
            "torch_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "auto_dtype": resolve_dtype("auto", "cpu", flags)}
