"""Stateful, batched streaming decode for the 12 Hz codec (`CodecDecoder`), one chunk of frames at a time.

Pure tensor code: `StreamingCodec.step` advances B streams by the same number of new frames in ONE
forward call, each row carrying its own state. The state is a dict of tensors with the batch first:

- every causal conv with span > 1 keeps its last `span - 1` input samples (zeros = the reference's
  left zero padding, so a fresh state is exact);
- every transposed conv with a trimmed tail keeps its last `ceil(trim / stride)` input frames and
  recomputes their overlap (no carried partial sums, so the bias is added exactly once, as in one call);
- the transformer keeps, per layer, the keys/values of the last positions in `kv_slots` slots.
  Slot 0 holds window position `base`, a multiple of `KV_ALIGN`, so every key sits in the same SIMD
  lane of the attention kernel as in the reference's whole-window call (sums of exact zeros for masked
  keys do not change a float sum, but a different lane or order would).

Nothing here knows about the reference's 300-frame windows or the ICL cut: that bookkeeping lives in
`codec_streams.py`, which decides per row the window position (`start`), `base` and the attention
length (`kv_len`) and resets rows at window boundaries. State size is O(receptive field): it does not
depend on how many frames a stream has decoded.

Exactness: the arithmetic is the whole-window decode's, operation for operation, so the result is
bitwise equal whenever PyTorch's CPU kernels round a chunk the way they round the whole window. They
do not always: convs choose oneDNN or im2col+GEMM from input size and batch, GEMMs round differently
for very few columns, and the flash-attention kernel's GEMMs depend on the query/key block shapes,
which depend on the window length (queries split by 64 once a window has >= 192 frames). Measured:
single streams with windows of 1-191 frames are bitwise equal; otherwise max |delta| ~1e-6 (tiny
codec, amplitude 0.1) to ~1e-5 (0.6B shapes, amplitude 0.16) -- float32 rounding, not drift.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .codec import CausalConv, CausalTransConv, CodecDecoder, ConvNeXtBlock, ResidualUnit, SnakeBeta, UpsampleBlock
from .layers import RopeTable, sdpa_attention

# Decoder layers from this index on (the 2nd upsampling block onwards) run in time slices, see `step`.
TILED_FROM = 2
# Frames (over all rows) per time slice of those layers on a CPU (`StreamingCodec`'s `tile_frames`, the
# CPU backend's `codec_tile_frames`): small enough that a slice's activations stay in the CPU's caches,
# big enough that its calls stay few. 8 -> 16, 0.6B, in-process A/B, ms per frame (min of 4-5 rounds):
# bfloat16 run's codec at 8 streams 18.8 -> 17.1, 4 streams 16.9 -> 16.2, one 18.7 -> 18.6; float32
# (parity) codec at 8 streams 31.6 -> 31.0 (the same waveform to the bit); 32 lost at 8 streams (18.7).
TILE_FRAMES = 16

# Keys are laid out at window position mod KV_ALIGN, like the reference's SIMD lanes (8 floats on AVX2,
# 16 on AVX-512); 16 covers both.
KV_ALIGN = 16


def round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def next_base(end: int, window: int) -> int:
    """Window position of K/V slot 0 once positions < `end` are decoded: the oldest key a later query sees."""
    return max(0, (end - (window - 1)) // KV_ALIGN * KV_ALIGN)


class StreamingCodec:
    """Runs a `CodecDecoder`'s modules chunk by chunk with explicit per-row state (no parameters of its own)."""

    def __init__(self, codec: CodecDecoder, max_window_frames: int = 400, tile_frames: int | None = TILE_FRAMES,
                 upload=None):
        """`max_window_frames` bounds the window positions (RoPE table size) a call may use;
        `tile_frames`: frames (over all rows) per time slice of the late decoder layers (None: one slice);
        `upload(host tensor) -> device tensor`: how a call's positions reach the codec's device (the
        device layer's `copies.uploader`: pinned and non_blocking on accelerators; default a plain copy)."""
        self.codec = codec
        self.upload = upload or (lambda tensor: tensor.to(self.device))
        self.tile_frames = tile_frames
        cfg = codec.cfg
        self.window = cfg.sliding_window
        self.samples_per_frame = cfg.samples_per_frame
        # Keys kept between calls: positions base..start-1, at most window - 1 + KV_ALIGN - 1 of them.
        self.kv_slots = round_up(self.window - 1 + KV_ALIGN - 1, KV_ALIGN)
        self.names = {m: n for n, m in codec.named_modules()}
        # The kernel-7 convs of residual units a device layer runs channels-last (state (B, span - 1, C)).
        self.channels_last = {m.conv1 for m in codec.modules()
                              if isinstance(m, ResidualUnit) and m.channels_last is not None}
        # RoPE table computed once, on the codec's device like the whole decode's own tables (bitwise
        # equal to them), then gathered per row; `.to` in `_transformer` is a no-op unless the codec moved.
        table = RopeTable(max_window_frames, cfg.head_dim, cfg.rope_theta, self.dtype, self.device)
        self.cos, self.sin = table.cos, table.sin

    @property
    def device(self):
        return self.codec.pre_conv.conv.weight.device

    @property
    def dtype(self):
        return self.codec.pre_conv.conv.weight.dtype

    def state_bytes(self, batch: int) -> int:
        """What `new_state(batch)` allocates, in bytes (worked out without allocating it)."""
        return sum(t.numel() * t.element_size() for t in self.new_state(batch, device="meta").values())

    def new_state(self, batch: int, device=None) -> dict[str, torch.Tensor]:
        """Zero state for `batch` fresh streams (batch is dim 0 of every tensor), on the codec's device
        (or `device`)."""
        state, like = {}, dict(device=device or self.device, dtype=self.dtype)
        for module, name in self.names.items():
            if isinstance(module, CausalConv) and module.span > 1:
                assert module.stride == 1, "the codec decoder's convs all have stride 1"
                shape = (module.span - 1, module.conv.in_channels)  # channels-last: see `_layers`
                state[name] = torch.zeros(batch, *(shape if module in self.channels_last else shape[::-1]), **like)
            elif isinstance(module, CausalTransConv) and module.trim > 0:
                keep = math.ceil(module.trim / module.conv.stride[0])
                state[name] = torch.zeros(batch, module.conv.in_channels, keep, **like)
        cfg = self.codec.cfg
        shape = (batch, cfg.num_hidden_layers, cfg.num_key_value_heads, self.kv_slots, cfg.head_dim)
        state["keys"] = torch.zeros(shape, **like)
        state["values"] = torch.zeros(shape, **like)
        return state

    # -- one chunk ---------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, codes: torch.Tensor, state: dict, start: list[int], base: list[int], kv_len: list[int]):
        """Decode `codes` (B, 16, n) continuing each row's `state` -> (waveform (B, 1, n * 1920), new state).

        `start[b]`: window position (RoPE position) of row b's first new frame; `base[b]`: window position
        of its K/V slot 0 (a multiple of KV_ALIGN); `kv_len[b]`: keys its attention call spans, counted
        from `base[b]`, at least through the row's new frames (the caller picks it so the reference's
        vector tail is reproduced).
        """
        st = dict(state)
        c = self.codec
        x = self._conv(c.pre_conv, c.quantizer.decode(codes), st)
        x = self._transformer(x.transpose(1, 2), st, start, base, kv_len).transpose(1, 2)
        return self._upsample(x, codes, st)

    @torch.no_grad()
    def step_fixed(self, codes: torch.Tensor, state: dict, start: torch.Tensor, base: torch.Tensor,
                   keep: torch.Tensor):
        """`step` for a call whose shapes depend only on (B, n): what a device graph can capture.

        `start`, `base` (B,) are device tensors (as in `step`); `keep[b]`: the K/V slot, counted from
        `base[b]`, that becomes the row's slot 0 after the call (`next_base(start + n) - base`). Attention
        runs once over a fixed width (`kv_slots` + n, aligned) for all rows, the mask hiding what a row
        must not see, instead of one call per attention length: the same keys and weights, summed in
        another order than the CPU reference's (float rounding, not a different result). No host reads:
        nothing here depends on the values of the inputs.
        """
        st = dict(state)
        c = self.codec
        x = self._conv(c.pre_conv, c.quantizer.decode(codes), st)
        width = round_up(self.kv_slots + codes.shape[-1], KV_ALIGN)
        x = self._layers_of_transformer(x.transpose(1, 2), st, start, base, keep, width,
                                        [(width, slice(None))]).transpose(1, 2)
        return self._upsample(x, codes, st)

    def _upsample(self, x, codes, st):
        c = self.codec
        for transposed, convnext in c.upsample:
            x = self._convnext(convnext, self._trans_conv(transposed, x, st), st)
        for layer in c.decoder[:TILED_FROM]:
            x = self._layer(layer, x, st)
        # The later upsampling blocks hold little weight but most of the activations (0.6B: 96 channels
        # x 1920 samples per frame, 0.7 MB, through ~20 passes). Run them over time slices of about
        # `tile_frames` frames in all, each slice carrying the causal state to the next, so a slice's
        # activations stay in cache: at batch 8-16 this halved the decode's time (measured with the direct
        # convolutions; the slice size: `TILE_FRAMES`).
        rate = x.shape[-1] // codes.shape[-1]  # samples per frame at this point
        tile = self.tile_frames or codes.shape[0] * codes.shape[-1]
        step = max(1, tile // codes.shape[0]) * rate
        pieces = []
        for i in range(0, x.shape[-1], step):
            y = x[..., i:i + step]
            for layer in c.decoder[TILED_FROM:]:
                y = self._layer(layer, y, st)
            pieces.append(y)
        x = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)
        return x.clamp(-1, 1), st

    def _layer(self, layer, x, st):
        if isinstance(layer, CausalConv):
            return self._conv(layer, x, st)
        if isinstance(layer, CausalTransConv):
            return self._trans_conv(layer, x, st)
        if isinstance(layer, SnakeBeta):
            return layer(x)
        if isinstance(layer, ResidualUnit):
            return self._layers([layer], x, st)
        assert isinstance(layer, UpsampleBlock), type(layer)
        return self._layers(layer.block, x, st)

    def _layers(self, layers, x, st):
        """`layers` in order; consecutive residual units with a channels-last form (a device layer's) run in
        it, between one layout change in and one out."""
        unit = None  # the last channels-last unit run, while x is channels-last
        for sub in layers:
            cl = sub.channels_last if isinstance(sub, ResidualUnit) else None
            if cl is None:
                if unit is not None:
                    x, unit = unit.leave(x), None
                if isinstance(sub, ResidualUnit):
                    x = x + sub.conv2(sub.act2(self._conv(sub.conv1, sub.act1(x), st)))
                else:
                    x = self._layer(sub, x, st)
                continue
            if unit is None:
                x = cl.enter(x)
            name = self.names[sub.conv1]
            x, st[name] = cl(x, st[name])
            unit = cl
        return unit.leave(x) if unit is not None else x

    def _conv(self, conv: CausalConv, x, st):  # (B, C, n) -> (B, C', n)
        if conv.span == 1:
            return conv(x)
        name = self.names[conv]
        full = torch.cat([st[name], x], dim=-1)
        st[name] = full[..., full.shape[-1] - (conv.span - 1):].contiguous()
        return conv.conv(full)

    def _trans_conv(self, tconv: CausalTransConv, x, st):  # (B, C, n) -> (B, C', n * stride)
        if tconv.trim == 0:
            return tconv(x)
        name, stride, n = self.names[tconv], tconv.conv.stride[0], x.shape[-1]
        keep = st[name].shape[-1]
        full = torch.cat([st[name], x], dim=-1)
        st[name] = full[..., full.shape[-1] - keep:].contiguous()
        return tconv.conv(full)[..., keep * stride:(keep + n) * stride]

    def _convnext(self, block: ConvNeXtBlock, x, st):
        h = block.norm(self._conv(block.dwconv, x, st).transpose(1, 2))
        h = block.pwconv2(F.gelu(block.pwconv1(h)))
        return x + (block.gamma * h).transpose(1, 2)

    def _transformer(self, x, st, start, base, kv_len):  # (B, n, latent)
        b, n, _ = x.shape
        # Everything this call needs from the host in ONE upload (built on the host, copied without a
        # wait): each row's start, base and K/V keep offset, then the rows of each attention group.
        groups = [(length, [r for r in range(b) if kv_len[r] == length]) for length in sorted(set(kv_len))]
        keep = [next_base(s + n, self.window) - o for s, o in zip(start, base)]
        rows = [r for _, members in groups for r in members] if len(groups) > 1 else []
        packed = self.upload(torch.tensor(list(start) + list(base) + keep + rows, dtype=torch.long))
        start_t, base_t, keep_t = packed[:b], packed[b:2 * b], packed[2 * b:3 * b]
        if len(groups) == 1:  # one group: all rows, no index
            selections = [(groups[0][0], slice(None))]
        else:
            selections, at = [], 3 * b
            for length, members in groups:
                selections.append((length, packed[at:at + len(members)]))
                at += len(members)
        assert all(k >= s + n - o for s, o, k in zip(start, base, kv_len)), "kv_len must span the new keys"
        width = max(self.kv_slots, round_up(max(s - o for s, o in zip(start, base)) + n, KV_ALIGN),
                    max(kv_len))
        return self._layers_of_transformer(x, st, start_t, base_t, keep_t, width, selections)

    def _layers_of_transformer(self, x, st, start_t, base_t, keep_t, width, selections):
        """The transformer over `x` (B, n, latent), the rows' K/V padded to `width` slots;
        `selections` [(kv_len, rows)]: one attention call per group of rows (see `_attention`)."""
        tr, dev = self.codec.pre_transformer, x.device
        x = tr.input_proj(x)
        b, n, _ = x.shape
        pos = start_t[:, None] + torch.arange(n, device=dev)  # (B, n) window positions of the new frames
        cos, sin = self.cos.to(dev)[pos], self.sin.to(dev)[pos]
        key_pos = base_t[:, None] + torch.arange(width, device=dev)  # (B, width)
        mask = (key_pos[:, None, :] <= pos[:, :, None]) & (key_pos[:, None, :] > pos[:, :, None] - self.window)
        mask = mask[:, None]  # (B, 1, n, width)
        slot = (pos - base_t[:, None])  # (B, n) slot of each new key
        keep = (keep_t[:, None] + torch.arange(self.kv_slots, device=dev)).clamp(max=width - 1)  # (B, kv_slots)
        new_keys, new_values = [], []
        for i, layer in enumerate(tr.layers):
            h, k, v = self._attention(layer.self_attn, layer.input_layernorm(x), cos, sin, st, i, slot, width,
                                      mask, selections)
            x = x + layer.self_attn_layer_scale(h)
            x = x + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(x)))
            idx = keep[:, None, :, None].expand(b, k.shape[1], self.kv_slots, k.shape[-1])
            new_keys.append(k.gather(2, idx))
            new_values.append(v.gather(2, idx))
        st["keys"], st["values"] = torch.stack(new_keys, 1), torch.stack(new_values, 1)
        return tr.output_proj(tr.norm(x))

    def _attention(self, attn, x, cos, sin, st, layer, slot, width, mask, selections):
        """Attention.forward's arithmetic, against the row's K/V slots; rows grouped by their attention
        length: `selections` [(kv_len, rows: a slice or a device index tensor)]."""
        b, n, _ = x.shape
        q, k, v = attn.project(x, cos, sin)
        keys = F.pad(st["keys"][:, layer], (0, 0, 0, width - self.kv_slots))
        values = F.pad(st["values"][:, layer], (0, 0, 0, width - self.kv_slots))
        idx = slot[:, None, :, None].expand(b, attn.kv_heads, n, attn.head_dim)
        keys, values = keys.scatter(2, idx, k), values.scatter(2, idx, v)
        out = torch.empty_like(q)
        for length, sel in selections:
            # Every query sees at least its own key (slot pos - base < kv_len): no fully masked row.
            out[sel] = sdpa_attention(q[sel], keys[sel, :, :length], values[sel, :, :length],
                                      mask[sel, :, :, :length], causal=False)
        return attn.o_proj(out.transpose(1, 2).reshape(b, n, -1)), keys, values
