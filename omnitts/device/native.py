"""omnitts' own CPU kernels (`native_kernels.cpp`: linear layers, RMSNorm, bfloat16 SnakeBeta, attention
for one query per row), compiled on first use and cached.

Why: at batch 1 a frame is bound by how fast its matrix-vector products read the weights, and at
small batches by how many multiply-adds each weight byte feeds. oneDNN's packed inner product reads
float32 weights at about two thirds of this kind of machine's streaming rate at batch 1; a kernel
over 16-column panels, one contiguous stream per panel, reads them ~1.4x faster and stays ahead up to
batch 32, in float32 and bfloat16, and computes float32 over bfloat16-stored weights (widened as read,
exact) from half the bytes (measured: see docs/performance.md). Every output sums over k in order, so a
row's result does not depend on its batch. On Xeons with AMX (Sapphire Rapids and later) bfloat16 linears
run on its tiles instead, the same layout read as tiles of 32 k by 16 outputs, row-invariant too (`amx()`;
`OMNITTS_AMX=0` keeps the VDPBF16PS kernel).

The library is built with the machine's own compiler for the machine's own CPU (`-march=native`):
there is no prebuilt binary to ship for CPUs that differ in AVX-512 / AVX512-BF16. `OMNITTS_NATIVE_MARCH`
names another target (`haswell`: AVX2 and FMA only, what a mixed fleet's oldest CPUs run; also how the
tests time the AVX2 path on an AVX-512 machine); `OMNITTS_CPU_PROFILE` (device/features.py) picks the
target of the CPU class it poses as. The build takes ~10 s once; the result is cached under
`$OMNITTS_CACHE_DIR` (default `~/.cache/omnitts`) in `native/<digest>/`, the digest covering the
source, the flags (the target included), torch's version and the CPU's model and flags, so a shared
home directory never hands one CPU, or one target, another's build. Written to a temporary name and
renamed, so concurrent first runs never load a half-written library.

When the build cannot happen (no C++ compiler, an unsupported CPU or torch, `OMNITTS_NATIVE=0`),
`available` says no, once with the reason, and the CPU linears stay on oneDNN: same results within
float rounding, just slower.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

from ..cache import cache_root
from .features import native_march

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("native_kernels.cpp")
# -ffp-contract=off: a product and a sum written apart stay rounded apart (the kernels copy roundings).
# The target (-march) comes first, from flags(), so flags added here can narrow it (-mno-avx512f).
FLAGS = ("-O3", "-fopenmp", "-std=c++20", "-ffp-contract=off", "-shared", "-fPIC", "-w")
_DTYPE_BITS = {torch.float32: 1, torch.bfloat16: 2}


def available(dtype: torch.dtype) -> bool:
    """Whether the native kernels run `dtype` on this machine (building them on first use)."""
    bits = _loaded_dtypes()
    return bool(bits & _DTYPE_BITS.get(dtype, 0))


def amx() -> bool:
    """Whether bfloat16 linears run on AMX tiles (a Xeon that has them, Linux granting their state, a build
    for this CPU, `OMNITTS_AMX` not 0); False where the kernels are off or unbuilt."""
    return bool(_loaded_dtypes()) and bool(torch.ops.omnitts.amx())


def vectorised_float32() -> bool:
    """Whether the loaded kernels vectorise float32 (AVX-512 builds); False where they are off or unbuilt."""
    return bool(_loaded_dtypes()) and bool(torch.ops.omnitts.vectorised_float32())


@functools.cache
def _loaded_dtypes() -> int:
    """The kernel's dtype bits once its library is loaded; 0 where it is off or cannot be built."""
    if os.environ.get("OMNITTS_NATIVE", "1") == "0":
        return 0
    try:
        # A process keeps the first library it loads: a second one (the source changed on disk) would
        # register the same operators again, which torch refuses by aborting.
        if not hasattr(torch.ops.omnitts, "dtypes"):
            torch.ops.load_library(str(library()))
        return int(torch.ops.omnitts.dtypes())
    except (OSError, RuntimeError, subprocess.SubprocessError, BuildError) as error:
        warnings.warn(f"omnitts: the native CPU kernels are unavailable ({error}); using oneDNN and torch instead",
                      RuntimeWarning, stacklevel=3)
        return 0


class BuildError(RuntimeError):
    """The native kernels could not be compiled here."""


def flags() -> tuple[str, ...]:
    """The compiler flags: `-march=$OMNITTS_NATIVE_MARCH`, else the `OMNITTS_CPU_PROFILE`'s target (default
    `native`, this CPU), then FLAGS."""
    return (f"-march={native_march()}", *FLAGS)


def library() -> Path:
    """The compiled library for this source, torch and CPU: built now if not cached yet."""
    target = cache_root() / "native" / _digest() / "omnitts_native.so"
    if not target.exists():
        build(target)
    return target


def build(target: Path) -> None:
    """Compile `native_kernels.cpp` into `target` (atomically: a temporary file renamed into place)."""
    wanted = os.environ.get("CXX")
    compiler = shutil.which(wanted) if wanted else shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        raise BuildError(f"C++ compiler {wanted!r} not found" if wanted else "no C++ compiler found (install g++ or set CXX)")
    if platform.machine() not in ("x86_64", "AMD64"):
        raise BuildError(f"no kernel for {platform.machine()} CPUs")
    said = io.StringIO()  # a CUDA build of torch without a GPU prints "No CUDA runtime is found" as this imports
    with contextlib.redirect_stderr(said):
        from torch.utils.cpp_extension import include_paths, library_paths
    if said.getvalue().strip():
        log.debug(f"omnitts: torch.utils.cpp_extension said: {said.getvalue().strip()}")

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    command = [compiler, *flags(),
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               *(f"-I{p}" for p in include_paths()), str(SOURCE),
               *(f"-L{p}" for p in library_paths()), "-lc10", "-ltorch_cpu",
               *(f"-Wl,-rpath,{p}" for p in library_paths()), "-o", tmp]
    # The library never prints: the CLI shows the "omnitts" logger's INFO lines (unless --quiet).
    log.info(f"omnitts: compiling its CPU kernels for this machine (once, about 10 s; kept in {target.parent})")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            march, profile = os.environ.get("OMNITTS_NATIVE_MARCH"), os.environ.get("OMNITTS_CPU_PROFILE")
            hint = (f" (OMNITTS_NATIVE_MARCH={march!r})" if march else
                    f" (OMNITTS_CPU_PROFILE={profile!r}: -march={native_march()})" if profile else "")
            raise BuildError(f"{Path(compiler).name} exited {done.returncode}{hint}: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _digest() -> str:
    """What the build depends on: the source and flags (the target included), torch, the compiler and the CPU's
    model and flags."""
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(" ".join(flags()).encode())
    h.update(torch.__version__.encode())
    h.update(os.environ.get("CXX", "").encode())
    h.update(_cpu_identity().encode())
    return h.hexdigest()[:16]


def _cpu_identity() -> str:
    """The CPU's model name and feature flags (Linux: /proc/cpuinfo), or the platform's description."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [line for line in lines if line.split(":")[0].strip() in ("model name", "flags")]
    return "\n".join(dict.fromkeys(wanted))
