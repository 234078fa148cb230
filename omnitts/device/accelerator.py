"""What CUDA and Ascend NPU backends share: torch_npu mirrors the torch.cuda API (streams, events,
graphs, graph pools), so one implementation serves both, parameterised by the device module.

Written against the public APIs; the CUDA backend has run on an H100 (docs/devices.md), the NPU
backend has not run on an Ascend device.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

from .base import WARMUP_RUNS, Backend


class PinnedTransfer:
    """A non-blocking device-to-host copy into a fresh pinned buffer, complete when its event fires.

    A fresh buffer per copy: a reused staging buffer must never be handed out as a view (the bug
    found in vllm-omni PR #3164's review); `result()` returns an owned copy.
    """

    def __init__(self, api, tensor: torch.Tensor, empty=None):
        # `empty(shape, dtype)` allocates the pinned buffer (a test passes a plain allocator: CPU-only torch
        # builds cannot pin memory).
        if empty is None:
            self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        else:
            self.host = empty(tensor.shape, tensor.dtype)
        self.host.copy_(tensor, non_blocking=True)
        self.event = api.Event()
        self.event.record()

    def result(self) -> np.ndarray:
        self.event.synchronize()
        return self.host.numpy().copy()


class Graph:
    def __init__(self, graph):
        self.graph = graph

    def replay(self) -> None:
        self.graph.replay()

    @property
    def replays(self) -> int:  # the CPU fake counts; real graphs do not
        return getattr(self.graph, "replays", 0)


class AcceleratorBackend(Backend):
    """Graphs captured after a warm-up on a side stream, into the pool the caller gives (one per engine)."""

    supports_graphs = True
    codec_tile_frames = None
    # A GPU's codec call costs mostly its launches and host work (an H200 run: 224 calls for 192 items, ~53 ms
    # a call, ~6 ms of it on the GPU): ready chunks wait up to 12 pumps (steps) for other streams.
    codec_gather = 12
    codec_fixed_shapes = True

    def pads_prefill(self, dtype: torch.dtype) -> bool:
        """Padded prefill (one graph per prompt-length bucket) for all but float32, the parity runs, which
        keep each prompt's own shape as the reference does; `OMNITTS_PREFILL_GRAPHS=1` / `0` decides."""
        switch = os.environ.get("OMNITTS_PREFILL_GRAPHS")
        if switch in ("0", "1"):
            return switch == "1"
        return dtype != torch.float32

    @property
    def api(self):
        """torch.cuda or torch.npu."""
        return getattr(torch, self.name)

    def new_graph(self, fn, restore, output, inputs):
        """An empty graph object of the device API (the arguments serve the CPU fake only)."""
        raise NotImplementedError

    def to_host(self, tensor: torch.Tensor) -> PinnedTransfer:
        return PinnedTransfer(self.api, tensor)

    def broken(self) -> str | None:
        """After a fault: a small computation on the device, waited for. A sticky error (CUDA's illegal
        memory access, an Ascend AI Core fault) leaves the context unusable, so this raises it again;
        then the error's one line, else None (the fault was the work's, not the device's)."""
        try:
            probe = torch.arange(4, dtype=torch.float32, device=self.device)
            total = float((probe * 2).sum().item())  # .item() waits for the device
            self.api.synchronize()
        except Exception as exc:  # noqa: BLE001 - whatever the device raises is the answer
            return f"{type(exc).__name__}: {' '.join(str(exc).split()) or '(no message)'}"
        return None if total == 12.0 else f"a test computation gave {total} instead of 12"

    def free_memory(self) -> int | None:
        """The device's free memory (`mem_get_info`), plus what torch's caching allocator holds unused; None
        where the device cannot say (a check that fails never stops a run)."""
        try:
            free, _ = self.api.mem_get_info()
            return free + self.api.memory_reserved() - self.api.memory_allocated()
        except Exception:  # noqa: BLE001 - an older torch_npu, a device that does not report it
            return None

    def graph_pool(self):
        return self.api.graph_pool_handle()

    def capture(self, fn, pool, restore, output, inputs=None) -> Graph:
        """Warm `fn` up once on a side stream, undo what the warm-up wrote to `restore`, capture `fn`.

        `restore`: the tensors the frame overwrites that must read as before (the slots' small per-row
        state); the warm-up's other writes must be harmless (the talker K/V it writes lands at each row's
        next position, which the real frame writes again). Only `restore` is cloned, and the clones are
        freed before the capture: a capture's extra memory is those clones while it warms up, never a
        copy of the K/V cache. `inputs` (default `restore`): every tensor the graph reads (the CPU fake
        checks their addresses on replay).
        """
        api = self.api
        side = api.Stream()
        saved = [t.clone() for t in restore]  # on the current stream, so before the side stream's wait below:
        side.wait_stream(api.current_stream())  # the warm-up's writes cannot overtake these clones
        try:
            with api.stream(side):
                for _ in range(WARMUP_RUNS):  # lazy initialisation and allocator state before capture
                    fn()
        finally:  # the warm-up must leave no trace in the slots, even when it fails
            api.current_stream().wait_stream(side)
            for tensor, copy in zip(restore, saved):
                tensor.copy_(copy)
            del saved  # freed (on the current stream, after the copies) before the capture allocates
        graph = self.new_graph(fn, restore, output, inputs if inputs is not None else restore)
        with self.capturing():
            with api.graph(graph, pool=pool):
                fn()
        return Graph(graph)

    @contextlib.contextmanager
    def capturing(self):
        """During capture, a host sync inside the frame is a bug: the device API's sync debug mode makes it
        raise (`torch.cuda.set_sync_debug_mode`; torch_npu has `torch.npu.set_sync_debug_mode` from 2.5), and
        the previous mode comes back afterwards. An API without the switch (older torch_npu) captures unchecked."""
        api = self.api
        setter, getter = getattr(api, "set_sync_debug_mode", None), getattr(api, "get_sync_debug_mode", None)
        if setter is None or getter is None:
            yield
            return
        previous = getter()
        setter("error")
        try:
            yield
        finally:
            setter(previous)
