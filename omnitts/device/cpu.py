"""The CPU's preparation of a loaded checkpoint: packed weights, native kernels, Winograd codec convolutions.

Runs once after loading (vLLM's `process_weights_after_loading`): the models arrive as published
(`models.loader.load_models`) and leave laid out for this CPU. What each step does and why is in
cpu_weights.py (the LMs) and cpu_convs.py (the codec); this module only decides which steps run, in which order.
"""

from __future__ import annotations

import torch

from ..models.layers import fuse_projections
from ..models.loader import Models
from .cpu_convs import channels_last_units, narrow_convs, pack_convs, pack_transposed_convs, winograd_convs
from .cpu_weights import (
    PackedLinear,
    Widener,
    can_pack,
    pack_linears,
    use_cpu_attention,
    use_native_norms,
    use_native_rope,
    use_native_snakes,
    use_native_swiglu,
)
from .hugepages import HugePageArena


def stores_linears(dtype: torch.dtype) -> bool:
    """Whether the talker's linear weights should stay as stored at load (`prepare_weights` packs them)."""
    return can_pack(dtype)


def prepare_weights(models: Models, dtype: torch.dtype, codec_dtype: torch.dtype, max_batch: int) -> None:
    """Lay `models` out for this CPU, in place. `max_batch`: the most rows an engine step will have
    (packed weights are laid out for it, see `cpu_weights.layout_batch`)."""
    talker = models.model.talker
    # q/k/v and gate/up projections merged: fewer, larger matrix products and one q/k norm and rotation.
    if can_pack(dtype):
        # Linear weights are still views of the file (`stores_linears`): each is widened and packed one
        # at a time, every temporary freed before the next. Packed weights live on huge pages: every
        # batch-1 step streams them all (see hugepages.py).
        widen, arena = Widener(), HugePageArena()
        fuse_projections(talker, lambda parts: PackedLinear(parts, dtype, max_batch, widen, arena))
        pack_linears(talker, dtype, max_batch, widen, arena)
        use_native_norms(talker, dtype)
        use_native_rope(talker, dtype)
        use_native_swiglu(talker, dtype)
    else:
        fuse_projections(talker)
    # The CPU attends in float32, bfloat16 models included (torch's bfloat16 CPU kernel is the slow one):
    # omnitts' kernel reads a bfloat16 K/V history as stored; torch's fallback gets a float32 history
    # (`Checkpoint.cache_dtype`), so the whole history is never re-widened at each step.
    use_cpu_attention(talker)
    codec = models.codec
    fuse_projections(codec)
    # float32 runs are the parity runs: their codec keeps the direct convolutions and torch's sine
    # (Winograd's rounding moves the waveform by ~1e-4 of its peak; see cpu_convs.WinogradConv1d).
    parity = dtype == torch.float32
    winograd_convs(codec, parity=parity)
    narrow_convs(codec, parity=parity)
    channels_last_units(codec)
    pack_transposed_convs(codec)
    pack_convs(codec)
    use_native_snakes(codec, codec_dtype, parity=parity)
