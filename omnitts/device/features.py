"""What this machine's processor can do, read at run time (CPUs differ between machines).

`dtype="auto"` asks for bfloat16 language models only where bfloat16 matrix products are native:
on CUDA / NPU, and on CPUs with AVX512-BF16 or AMX-BF16 (there a bf16 GEMV streams half the bytes
of float32, and bf16 GEMMs run at about 3x the float32 rate). Elsewhere bf16 is emulated and
slower than float32 (an AVX2-only machine ran the codec ~57x slower in bf16), so auto means float32.

`OMNITTS_CPU_PROFILE` makes this CPU behave as a lesser one, so that one machine runs (and tests) what
every CPU class runs: `avx2` (AVX2 + FMA, no AVX-512), `avx512` (AVX-512 without bf16), `avx512_bf16`
(AVX-512 with native bf16, no AMX) or `native` (as is, the default). The flags read here are masked to
the profile's (so `auto` resolves as on such a CPU), omnitts' kernels are built for the profile's
`-march` (device/native.py; `OMNITTS_NATIVE_MARCH` still wins) and torch is told the profile's kernel
level through `ATEN_CPU_CAPABILITY`, which torch reads once, at its first CPU operation: export both
before the process starts (scripts/cpu_profiles.py does); `import omnitts` sets the latter (unless
exported) when torch has computed nothing yet. A profile needs a CPU that has it: forcing AVX-512 on
an AVX2-only CPU is an error, not an emulation.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

from ..errors import OmniTTSError

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo names of native bf16 dot products
REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_tile",
                  "amx_int8")


@dataclass(frozen=True)
class Profile:
    """A class of CPU this one can pose as: what it needs, what it hides, how kernels are built for it."""
    march: str | None  # g++ -march for omnitts' kernels (None: native, this CPU)
    aten: str | None  # torch's ATEN_CPU_CAPABILITY (None: torch's own choice)
    needs: tuple[str, ...]  # flags this CPU must have to run the profile's code
    hides: tuple[str, ...]  # flag prefixes masked out of cpu_flags()


PROFILE_VARIABLE = "OMNITTS_CPU_PROFILE"
_AVX512 = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")  # -march=skylake-avx512's set
PROFILES = {
    "native": Profile(None, None, (), ()),
    "avx512_bf16": Profile("cooperlake", "avx512", (*_AVX512, "avx512_vnni", "avx512_bf16"), ("amx", "avx512_fp16")),
    "avx512": Profile("skylake-avx512", "avx512", _AVX512, ("amx", "avx512_fp16", "avx512_bf16")),
    "avx2": Profile("haswell", "avx2", ("avx2", "fma"), ("amx", "avx512", "avx_vnni")),
}


def cpu_profile() -> str:
    """The CPU profile asked for by `OMNITTS_CPU_PROFILE` (`native` when unset); an unknown name, or one
    this CPU cannot run, raises an error naming the variable and the fix."""
    name = os.environ.get(PROFILE_VARIABLE) or "native"
    if name not in PROFILES:
        raise OmniTTSError(f"{PROFILE_VARIABLE}={name!r} is not a CPU profile; use one of {', '.join(PROFILES)}")
    missing = [flag for flag in PROFILES[name].needs if flag not in _detected_flags()]
    if missing and _detected_flags():  # no flags at all: a CPU we cannot read, given the benefit of the doubt
        raise OmniTTSError(f"{PROFILE_VARIABLE}={name}: this CPU lacks {', '.join(missing)}, so it cannot run "
                           f"that profile's code; pick a lesser one ({', '.join(PROFILES)}) or unset it")
    return name


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
def _detected_flags() -> frozenset[str]:
    return frozenset((_cpuinfo(("flags", "Features")) or "").split())


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags the kernel reports (Linux /proc/cpuinfo; empty where unknown), less those
    `OMNITTS_CPU_PROFILE` hides."""
    hides = PROFILES[cpu_profile()].hides
    return frozenset(flag for flag in _detected_flags() if not flag.startswith(hides))


def native_march() -> str:
    """The -march omnitts' kernels are built for: `OMNITTS_NATIVE_MARCH`, else the profile's, else native."""
    return os.environ.get("OMNITTS_NATIVE_MARCH") or PROFILES[cpu_profile()].march or "native"


def profile_environment(name: str) -> dict[str, str]:
    """The variables a process must start with to run as CPU profile `name` (its torch kernel level too)."""
    profile = PROFILES[name]
    return {PROFILE_VARIABLE: name, **({"ATEN_CPU_CAPABILITY": profile.aten} if profile.aten else {})}


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
    return {"cpu": cpu_model(), "profile": cpu_profile(), "flags": [f for f in REPORTED_FLAGS if f in flags],
            "torch_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "auto_dtype": resolve_dtype("auto", "cpu", flags)}
