"""Count the aten ops of one engine frame on the GPU path's CPU stand-in: a proxy for kernels per frame.

On a GPU each non-view aten op of a captured frame is one kernel launch (views launch nothing), so the
count of one frame's ops bounds its launch overhead (~2.5 us each on an H100). This counts them on the
CPU with a TorchDispatchMode around `ModelRunner.frame`, with the model prepared the way a CUDA backend
prepares it (`device.prepare_generic`): plain `nn.Linear`s (q/k/v and gate/up merged), torch's sdpa
attention over the engine's K/V cache, and (with `fused`) device/fused.py's ops, each counted as the one
kernel it is on CUDA. Left out, because CUDA never runs them: the CPU's packed linears (oneDNN or
omnitts' native kernel), its native norm / rotary / SwiGLU / attention kernels and its row-invariant
chunked decode attention (`cpu_weights.chunked_decode_attention`: ~1,000 small ops a frame on its own).

The count depends on the layer counts, the batch and the sampling plan, not on widths: presets
`layers-0.6b` / `layers-1.7b` (omnitts.testing.checkpoint) have the real layer counts at tiny widths, so
counting builds a checkpoint in a second instead of writing the real 0.6B's gigabytes.
"""

from __future__ import annotations

import collections
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpCounter(TorchDispatchMode):
    """Counts every op dispatched under it by name (`add_`, `omnitts_fused.rms_norm`), views apart."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.views: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        namespace = packet._qualified_op_name.split("::")[0]
        name = packet.__name__ if namespace == "aten" else f"{namespace}.{packet.__name__}"
        (self.views if func.is_view else self.ops)[name] += 1
        return func(*args, **(kwargs or {}))


@dataclass
class FrameCount:
    """The ops of one frame: `ops` (non-view, one kernel each on a GPU) and `views` by name."""

    batch: int
    ops: collections.Counter = field(default_factory=collections.Counter)
    views: collections.Counter = field(default_factory=collections.Counter)

    @property
    def kernels(self) -> int:
        return sum(self.ops.values())

    @property
    def total(self) -> int:
        return self.kernels + sum(self.views.values())

    def summary(self, top: int = 15) -> str:
        groups = ", ".join(f"{name} {n}" for name, n in self.ops.most_common(top))
        return f"batch {self.batch}: {self.total} aten ops, {self.kernels} not views; largest: {groups}"


def load_generic(checkpoint, fused: bool, dtype: str = "float32", max_batch: int = 8):
    """`omnitts.load` of `checkpoint` on the CPU, prepared as `device.prepare_generic` prepares a GPU's
    models (`fused`: with device/fused.py's ops) instead of the CPU's own layout."""
    import omnitts
    from omnitts import checkpoint as checkpoints
    from omnitts import device

    def prepare(models, dev, lm_dtype, codec_dtype, batch):
        device.prepare_generic(models, fused)

    with mock.patch.object(checkpoints, "stores_linears", lambda dev, lm_dtype: False), \
            mock.patch.object(checkpoints, "prepare_weights", prepare):
        return omnitts.load(checkpoint, dtype=dtype, max_batch=max_batch)


def count_frame(checkpoint=None, preset: str = "layers-0.6b", batch: int = 8, fused: bool = True,
                sampled: bool = True, tts=None) -> FrameCount:
    """The ops of one engine frame for `batch` rows of `preset` (a checkpoint built in a temporary
    folder unless `checkpoint` or a loaded `tts` is given), float32. `sampled`: half the rows sample
    (seeded; the frame then computes noise, top-k and the rest), else every row is greedy."""
    with tempfile.TemporaryDirectory() as tmp:
        if tts is None:
            if checkpoint is None:
                from omnitts.testing.checkpoint import build_checkpoint

                checkpoint = build_checkpoint(Path(tmp) / "ck", preset=preset)
            tts = load_generic(checkpoint, fused, max_batch=batch)
        frame, rows = _running_frame(tts, batch, sampled)
        count = FrameCount(rows)
        counter = OpCounter()
        with counter, torch.inference_mode():
            frame()
        count.ops, count.views = counter.ops, counter.views
        return count


def _running_frame(tts, batch: int, sampled: bool):
    """An eager engine with `batch` rows past prefill: (a call running one frame for them, the rows)."""
    from omnitts.device import get_backend
    from omnitts.engine import Engine, EngineConfig
    from omnitts.request import Request

    device = tts.ckpt.device.type
    eng = Engine(tts.ckpt, EngineConfig(max_num_seqs=batch, max_positions=512, device=device),
                 backend=get_backend(device, eager=True))
    for i in range(batch):
        params = tts.default_params(not (sampled and i % 2 == 0), max_frames=20, seed=i)
        eng.add(tts.prompts.build(Request(f"Request number {i} reads.", speaker="ryan")), params, tag=i)
    eng.step()
    eng.step()  # prefill, then a frame: every row runs
    rows = len(eng.scheduler.running)
    steps = eng.steps_for([s.params for s in eng.scheduler.running])
    return (lambda: steps.run(rows, 256)), rows


def count_cuda_kernels(tts, batch: int = 8, sampled: bool = True) -> FrameCount:
    """The kernels (and copies) one eager frame of a CUDA-loaded `tts` launches, by name, from the profiler:
    what a captured frame graph replays. `ops` holds them (names cut to 80 characters); `views` is empty."""
    from torch.profiler import ProfilerActivity, profile

    frame, rows = _running_frame(tts, batch, sampled)
    with torch.inference_mode():
        frame()  # first calls: Triton compiles, sdpa picks its kernels
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            frame()
            torch.cuda.synchronize()
    count = FrameCount(rows)
    count.ops = collections.Counter(event.name[:80] for event in prof.events()
                                    if event.device_type == torch.autograd.DeviceType.CUDA)
    return count
