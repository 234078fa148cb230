"""What the first attention call on a new shape costs on a GPU, per sdpa backend set.

Why: on an H100 (torch 2.11) a whole `omnitts synth` spent 11.8 s in 2283 eager sdpa calls (5 ms each)
while capturing its graphs (docs/devices.md). If the default backend choice builds a plan per new
shape (cuDNN attention does), excluding it where the captured frames attend would cut start-up.

    python scripts/sdpa_first_calls.py

Times one first call per (batch, length) shape of the code predictor's attention (16 query heads,
8 key/value heads, head size 128, 1 to 16 positions), with the default backends and without cuDNN,
in bfloat16 and float32; each set gets shapes no earlier set used, and runs twice.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def first_calls(backends, dtype, batches) -> tuple[int, float]:
    total, count = 0.0, 0
    for b in batches:
        for length in range(1, 17):
            q = torch.randn(b, 16, 1 if length > 2 else length, 128, device="cuda", dtype=dtype)
            k = torch.randn(b, 16, length, 128, device="cuda", dtype=dtype)
            v = torch.randn_like(k)
            torch.cuda.synchronize()
            started = time.perf_counter()
            with sdpa_kernel(backends) if backends else torch.no_grad():
                F.scaled_dot_product_attention(q, k, v)
            torch.cuda.synchronize()
            total += time.perf_counter() - started
            count += 1
    return count, total


def main() -> None:
    cuda = torch.backends.cuda
    print(f"torch {torch.__version__} {torch.cuda.get_device_name()}: cudnn sdp {cuda.cudnn_sdp_enabled()}, "
          f"flash {cuda.flash_sdp_enabled()}, mem-efficient {cuda.mem_efficient_sdp_enabled()}")
    batches = iter([(1, 2, 4, 8), (3, 5, 6, 7), (9, 10, 11, 12), (13, 14, 15, 16)] * 2)
    for dtype in (torch.bfloat16, torch.float32):
        for label, backends in (("default", None), ("no cuDNN", NO_CUDNN)) * 2:
            count, total = first_calls(backends, dtype, next(batches))
            print(f"{label:9} {str(dtype):15} {count} new shapes: {total * 1e3:7.1f} ms ({total / count * 1e3:.2f} ms each)")


if __name__ == "__main__":
    main()
