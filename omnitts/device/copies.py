"""Host-to-device copies that do not stall the engine's stream.

Between two frames the host builds prompts, prefills and feeds the codec while the device still runs
the frame launched last; the one place it waits is `Engine._collect` (and, for audio, once per finished
item). A plain host-to-device copy (`torch.tensor(..., device=)`, `.to(device)`) breaks that: the copy
is ordered after everything queued on the stream and the host waits for it. A `non_blocking` copy from
ordinary (pageable) host memory is no better: CUDA stages it synchronously and torch_npu synchronises
the whole stream for it. Only a copy from pinned host memory is asynchronous, so `upload` pins.

The pinned staging tensor must outlive the copy. torch's pinned-memory allocators record the copy's
stream on the block and do not reuse it before the copy ends; `Uploader` also keeps each staging
tensor referenced until an event recorded after its copy has fired, so correctness does not rest on
an allocator detail (torch_npu's among them).

Device-to-host copies go through the backend's `to_host` (a handle read later, `PinnedTransfer` on
accelerators). A `Backend.upload` method would be the natural home for this; until the backend grows
one, `uploader(device)` gives the callable the engine, prompts and codec streams are handed.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import torch

# Staging tensors kept alive at most, whatever their events say, before the oldest is waited for (a run
# makes a handful of uploads per step; this only bounds memory if events never fire).
MAX_IN_FLIGHT = 256


class Uploader:
    """`uploader(host_tensor) -> device tensor`: pinned and non_blocking on accelerators, plain on the CPU.

    `api`: the device module (torch.cuda / torch.npu) whose `Event` marks a copy's end; `pin(tensor)`:
    how a staging copy is pinned (tests on CPU-only torch pass a stand-in; `Tensor.pin_memory` needs an
    accelerator build). A tensor already on the device is returned as it is.
    """

    def __init__(self, device, api=None, pin: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 accelerator: bool | None = None):
        self.device = torch.device(device)
        self.accelerator = self.device.type != "cpu" if accelerator is None else accelerator
        self.api = api if api is not None or not self.accelerator else getattr(torch, self.device.type)
        self.pin = pin or (lambda tensor: tensor.pin_memory())
        self.in_flight: deque = deque()  # (staging tensor, event) of copies that may still run

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self.accelerator:
            return tensor if tensor.device == self.device else tensor.to(self.device)
        if tensor.device.type != "cpu":
            return tensor  # already on the device (a voice cloned there, an embedding)
        self._release()
        staging = tensor if tensor.is_pinned() else self.pin(tensor)
        out = staging.to(self.device, non_blocking=True)
        event = self.api.Event()
        event.record()
        self.in_flight.append((staging, event))
        return out

    def _release(self) -> None:
        """Drop the staging tensors whose copies have ended (never waits, unless MAX_IN_FLIGHT are held)."""
        while self.in_flight and (len(self.in_flight) >= MAX_IN_FLIGHT or self.in_flight[0][1].query()):
            staging, event = self.in_flight.popleft()
            event.synchronize()  # a no-op once query() said so


_UPLOADERS: dict[torch.device, Uploader] = {}


def uploader(device) -> Uploader:
    """The process's uploader to `device` (one per device, so staging tensors are tracked in one place)."""
    device = torch.device(device)
    if device not in _UPLOADERS:
        _UPLOADERS[device] = Uploader(device)
    return _UPLOADERS[device]


def upload(tensor: torch.Tensor, device) -> torch.Tensor:
    """`tensor` (host) on `device`, without the host waiting for the stream (see `Uploader`)."""
    return uploader(device)(tensor)
