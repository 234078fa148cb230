"""The key/value histories attention reads, owned by the caller (`Attention` takes one per forward).

Three layouts, one interface (`length`, `mask(new)`, `update(layer, k, v) -> (keys, values)`, `attend`):
`KVCache` grows by concatenation (the slow path, one eager sequence), `FrameKVCache` is allocated once for
short sequences restarted often (the code predictor's frame), and `StaticKVCache` keeps every shape fixed,
for a frame replayed as a device graph. The engine's per-slot talker cache (engine/state.py) has the same
interface. They know nothing of models or devices; a backend may pass a fused `attend` kernel.
"""

from __future__ import annotations

import torch

from .layers import sdpa_attention


class KVCache:
    """Growing per-layer key/value history for one eager sequence (the slow path).

    Any object with `length` and `update(layer, k, v) -> (keys, values)` can stand in for it; the
    engine uses preallocated per-slot caches with the same interface.
    """

    attend = None  # no kernel of its own: the stack's default

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def mask(self, new: int) -> None:
        """No mask: a forward of several positions on an empty cache is causal, later ones see it all."""
        return None

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Add k, v (B, Hkv, T, D) for `layer`; return the whole history."""
        if self.keys[layer] is not None:
            k = torch.cat((self.keys[layer], k), dim=2)
            v = torch.cat((self.values[layer], v), dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class FrameKVCache:
    """`KVCache`'s behaviour without its allocations, for short sequences restarted often (the code
    predictor's frame): `rows` x `capacity` positions per layer, allocated once.

    `start(batch)` rewinds rows 0..batch-1 to position 0; `update` writes the new keys in place and
    returns the filled prefix (no mask needed, nothing stale is visible). `dtype` may be wider than
    the model's: bfloat16 models whose attention runs in float32 (`float32_attention`) then widen
    each key once, on write, instead of the whole history at every step. Same results as `KVCache`
    (the same values attended in the same order).
    """

    attend = None

    def __init__(self, layers: int, rows: int, kv_heads: int, capacity: int, head_dim: int, dtype, device):
        shape = (rows, kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.capacity = capacity
        self.length = 0
        self._batch = 0
        # Row offsets for `store_target`, one (rows,) tensor per start position, made now (not in a capture).
        self._starts = torch.arange(capacity, device=device)[:, None].expand(capacity, rows).contiguous()

    def start(self, batch: int) -> "FrameKVCache":
        assert batch <= self.k[0].shape[0], f"batch {batch} exceeds the cache's {self.k[0].shape[0]} rows"
        self.length, self._batch = 0, batch
        return self

    def mask(self, new: int) -> None:
        return None

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, Hkv, T, D) at the next T positions; return positions 0..end of rows 0..B-1."""
        end = self._write(layer, k, v)
        return self.k[layer][: self._batch, :, :end], self.v[layer][: self._batch, :, :end]

    def store_target(self, layer: int, t: int, dtype: torch.dtype):
        """Where a fused kernel writes the next `t` positions of rows 0..B-1 itself (`layers.norm_rope_store`),
        then calls `stored`: the buffers and each row's first position; None where they hold another dtype."""
        if self.k[layer].dtype != dtype:
            return None
        assert self.length + t <= self.capacity, f"{self.length + t} positions exceed the cache's capacity"
        return self.k[layer][: self._batch], self.v[layer][: self._batch], self._starts[self.length, : self._batch]

    def stored(self, layer: int, t: int):
        """After a kernel wrote `store_target`'s positions: what `update` returns."""
        end = self._advance(layer, t)
        return self.k[layer][: self._batch, :, :end], self.v[layer][: self._batch, :, :end]

    def _write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> int:
        """k, v into rows 0..B-1 at the next positions (which advance after the last layer); returns their end."""
        start, end = self.length, self.length + k.shape[2]
        assert end <= self.capacity, f"{end} positions exceed the cache's capacity {self.capacity}"
        self.k[layer][: self._batch, :, start:end] = k
        self.v[layer][: self._batch, :, start:end] = v
        return self._advance(layer, k.shape[2])

    def _advance(self, layer: int, t: int) -> int:
        """The end of the `t` positions just written; positions advance once the last layer has written."""
        end = self.length + t
        if layer == len(self.k) - 1:
            self.length = end
        return end


class StaticKVCache(FrameKVCache):
    """Fixed-shape per-layer key/value buffers of `capacity` positions for up to `rows` rows.

    For short loops replayed as device graphs (the code predictor's frame: positions 0..G-1). The
    buffers are allocated once; `start(batch)` clears rows 0..batch-1 and rewinds to position 0;
    `update` writes new keys in place at the next positions and always returns all `capacity`
    positions, so every step of every frame attends over identical shapes. `mask()` (True = attend,
    (1, 1, T, capacity)) hides the positions not yet written and keeps the new ones causal; `attend`
    is the kernel meant for this layout (default `sdpa_attention`; a backend may pass a fused one).
    Positions advance after the last layer has written, so one forward = one chunk of positions.
    """

    def __init__(self, layers: int, rows: int, kv_heads: int, capacity: int, head_dim: int, dtype, device,
                 attend=sdpa_attention):
        super().__init__(layers, rows, kv_heads, capacity, head_dim, dtype, device)
        self.attend = attend
        keys = torch.arange(capacity, device=device)
        self._causal = keys[None, :] <= keys[:, None]  # (capacity, capacity): query row p sees keys <= p

    def start(self, batch: int) -> "StaticKVCache":
        """Begin a new sequence chunk for rows 0..batch-1 (stale keys cleared: masked garbage could be NaN)."""
        super().start(batch)
        for buffer in self.k + self.v:
            buffer[:batch].zero_()
        return self

    def store_target(self, layer: int, t: int, dtype: torch.dtype):
        return None  # its `update` returns every position (the NPU's layout): keep that path

    def mask(self, new: int) -> torch.Tensor:
        """(1, 1, new, capacity) boolean, True = attend, for the next `new` positions."""
        return self._causal[self.length : self.length + new][None, None]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, Hkv, T, D) at the next T positions; return the full (B, Hkv, capacity, D) buffers."""
        self._write(layer, k, v)
        return self.k[layer][: self._batch], self.v[layer][: self._batch]
