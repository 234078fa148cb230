"""Everything the engine keeps on the device per running slot, preallocated once.

Running requests occupy rows 0..n-1 of every tensor here (the batch is always a prefix, so a step
reads contiguous views and no per-step gather is needed). When a request finishes, the last running
row is moved into its place (`move`). Nothing is allocated per step.
"""

from __future__ import annotations

import torch

from ..params import RowParams, put


class SlotCache:
    """Talker K/V for `slots` rows x `capacity` positions per layer, with the attention `update` hook.

    Bind it before a forward: `prefill(start, count)` writes fresh keys to rows start..start+count and
    attends to them directly; `decode(batch, positions, span)` writes one key per row at that row's
    position and returns the first `span` positions of rows 0..batch-1.
    """

    def __init__(self, layers: int, slots: int, kv_heads: int, capacity: int, head_dim: int, dtype, device):
        shape = (slots, kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.capacity = capacity
        # What the stack reads to choose causal attention without a mask: 0 while a prefill is bound
        # (fresh rows, nothing before the new positions), 1 while decoding (callers pass masks).
        self.length = 1
        self._rows = slice(0, 0)
        self._positions = None
        self._row_index = None
        self._span = 0

    def prefill(self, start: int, count: int) -> None:
        self._rows, self._positions, self.length = slice(start, start + count), None, 0

    def prefill_row(self, row: torch.Tensor) -> None:
        """Bind a prefill of one prompt into the slot held by `row` (a one-element device tensor): the row
        is read on the device, so one captured prefill serves every slot."""
        self._rows, self._positions, self.length = row, None, 0

    def decode(self, batch: int, positions: torch.Tensor, span: int) -> None:
        self._rows, self._positions, self._span, self.length = slice(0, batch), positions, span, 1
        self._row_index = torch.arange(batch, device=positions.device)  # one per frame, not per layer

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self._positions is None:  # prefill: k, v (count, Hkv, T, D)
            rows, t = self._rows, k.shape[2]
            if isinstance(rows, torch.Tensor):  # `prefill_row`
                self.k[layer][:, :, :t].index_copy_(0, rows, k.to(self.k[layer].dtype))
                self.v[layer][:, :, :t].index_copy_(0, rows, v.to(self.v[layer].dtype))
            else:
                self.k[layer][rows, :, :t] = k
                self.v[layer][rows, :, :t] = v
            return k, v
        rows, dtype = self._row_index, self.k[layer].dtype  # dtype: may be wider than the model's
        self.k[layer][rows, :, self._positions] = k[:, :, 0].to(dtype)
        self.v[layer][rows, :, self._positions] = v[:, :, 0].to(dtype)
        return self.stored(layer, 1)

    def store_target(self, layer: int, t: int, dtype):
        """Decoding: where a fused kernel writes each row's new key and value itself (`layers.norm_rope_store`),
        then calls `stored`: rows 0..batch-1 and their positions. None while prefilling, or where the cache
        holds another dtype than the model computes in."""
        if self._positions is None or t != 1 or self.k[layer].dtype != dtype:
            return None
        rows = self._rows
        return self.k[layer][rows], self.v[layer][rows], self._positions

    def stored(self, layer: int, t: int):
        """While decoding, once this frame's keys are written: the first `span` positions of the batch's rows."""
        return self.k[layer][self._rows, :, : self._span], self.v[layer][self._rows, :, : self._span]

    def tensors(self) -> list[torch.Tensor]:
        return self.k + self.v

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of row `src` onto row `dst` (compaction): what lies beyond
        a row's length is never attended to, and the whole capacity is ~470 MB at 1.7B / 4096 positions."""
        for tensor in self.tensors():
            tensor[dst, :, :length].copy_(tensor[src, :, :length])


class SlotState:
    """Per-row decoding state: logits awaiting a choice, last hidden, history, counters, text, params.

    No noise buffer: a row's random numbers are a function of its seed (in `params`) and `generated`.
    """

    def __init__(self, slots: int, cfg, text_capacity: int, dtype, device):
        t = cfg.talker
        self.slots = slots
        self.logits = torch.zeros((slots, t.vocab_size), dtype=torch.float32, device=device)
        self.hidden = torch.zeros((slots, t.hidden_size), dtype=dtype, device=device)
        self.seen = torch.zeros((slots, t.vocab_size), dtype=torch.bool, device=device)
        self.generated = torch.zeros(slots, dtype=torch.long, device=device)  # frames so far (also the noise counter)
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)  # talker positions filled
        self.trailing = torch.zeros((slots, text_capacity + 1, t.hidden_size), dtype=dtype, device=device)
        self.trailing_len = torch.zeros(slots, dtype=torch.long, device=device)
        self.codes = torch.zeros((slots, t.num_code_groups), dtype=torch.long, device=device)
        self.params = RowParams.empty(slots, device)
        self.text_capacity = text_capacity

    def per_row(self) -> list[torch.Tensor]:
        """Tensors whose row i belongs to the request in slot i (moved together on compaction)."""
        return [self.logits, self.hidden, self.seen, self.generated, self.lengths, self.trailing,
                self.trailing_len, *self.params.tensors()]

    def written(self) -> list[torch.Tensor]:
        """The tensors a frame overwrites (its codes included): what a graph's warm-up must restore. Small
        (no K/V, no text): a frame's K/V writes land at each row's next position, which the real frame
        writes again, and the trailing text and parameters are only read."""
        return [self.logits, self.hidden, self.seen, self.generated, self.lengths, self.codes]

    def reset(self, row: int) -> None:
        put(self.seen, row, False)
        put(self.generated, row, 0)

    def load_text(self, row: int, trailing: torch.Tensor, pad: torch.Tensor) -> None:
        """Trailing text of the request in `row`, followed by tts_pad (used once the text runs out)."""
        n = trailing.shape[0]
        self.trailing[row, :n] = trailing
        self.trailing[row, n] = pad
        put(self.trailing_len, row, n)


def move_row(tensors: list[torch.Tensor], src: int, dst: int) -> None:
    """Copy row `src` onto row `dst` in every tensor (compaction after a request finishes)."""
    for tensor in tensors:
        tensor[dst].copy_(tensor[src])
