"""A recorder of the host<->device copies Python code asks for, on the CPU (no device needed).

On a CPU-only machine the CPU plays the device, so a copy cannot be told by the devices of its
tensors; the recorder tells it by provenance. A tensor is *host* when it was made from host data
without a device (`torch.tensor`, `torch.as_tensor`, `torch.from_numpy`, and `torch.zeros`, `ones`,
`empty`, `full`, `arange` with no `device=`), by
`Tensor.cpu()` or `Tensor.pin_memory()`, or by an op whose tensor inputs are all host (views
included); every other tensor (parameters, activations, the engine's state) is on the *device*.
Then, while the recorder is active:

- `torch.tensor(data, device=...)`, `torch.as_tensor(data, device=...)`, `device_tensor.new_tensor(data)`:
  a blocking upload (the data is copied from pageable memory as the tensor is made);
- `host.to(device, non_blocking=b)` (any device: on the CPU the engine's device is the CPU),
  `host.cuda()`: an upload, blocking unless `b`; a non_blocking
  upload from unpinned memory is an error (`Copy.error`): torch_npu synchronises the stream for it,
  CUDA stages it synchronously;
- `device.copy_(host)`, `device[index] = host`: a blocking upload; `host.copy_(device)`: a download;
- `device[index] = number` where `device[index]` is one element (0-dim): a blocking upload (CUDA copies
  the number from pageable memory and waits: seen under `set_sync_debug_mode` on an H200, torch 2.11;
  a number stored into a larger slice is a fill with the number as a kernel argument, no copy);
- `device.cpu()`, `device.to("cpu")` (the CPU named by a string), `.numpy()`, `.tolist()`, `.item()`,
  `int()`, `float()`, `bool()`, `operator.index`: a blocking download (a host sync).

`allow(owner, name, via)` names a helper whose copies are intended (the device layer's uploader, a
backend's `to_host`): copies made inside it are recorded with `via` set, and what an uploading
helper returns counts as on the device. `to_host` handles are followed: creating one records a
`Transfer` event and every `result()` a `Wait`, with the functions on the stack, so a test can tell a
wait deferred past the next engine step from one made at once. `mark(name)` adds a marker event.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

_HERE = Path(__file__).resolve()
_TORCH = Path(torch.__file__).resolve().parent


@dataclass
class Copy:
    kind: str  # "upload" (host -> device) or "download" (device -> host, a sync)
    api: str  # the call that made it
    blocking: bool
    where: str  # file:line (function) of the first caller outside torch and this module
    via: str | None = None  # the allowed helper it was made in, if any
    pinned: bool | None = None  # uploads: whether the source was pinned

    @property
    def error(self) -> str | None:
        if self.kind == "upload" and not self.blocking and not self.pinned:
            return "non_blocking upload from unpinned memory (torch_npu syncs the stream; CUDA stages it synchronously)"
        return None

    def __str__(self) -> str:
        how = "blocking" if self.blocking else "non_blocking" + (", pinned" if self.pinned else ", UNPINNED")
        return f"{self.kind} by {self.api} ({how}) at {self.where}" + (f" via {self.via}" if self.via else "")


@dataclass
class Transfer:
    handle: int  # id() of the handle
    where: str
    via: str


@dataclass
class Wait:
    handle: int
    where: str
    stack: list[str] = field(default_factory=list)  # qualified names of the functions on the stack


@dataclass
class Marker:
    name: str


def _caller() -> tuple[str, list[str]]:
    """(file:line (function) of the first frame outside torch and this module, qualified names on the stack)."""
    frame, where, stack = sys._getframe(1), None, []
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        stack.append(_qualname(frame))
        if where is None and path.resolve() != _HERE and _TORCH not in path.resolve().parents:
            try:
                shown = path.resolve().relative_to(Path.cwd())
            except ValueError:
                shown = path
            where = f"{shown}:{frame.f_lineno} ({_qualname(frame)})"
        frame = frame.f_back
    return where or "?", stack


def _qualname(frame) -> str:
    """The frame's function as `Class.method` (`co_qualname` from Python 3.11; before, from `self`)."""
    code = frame.f_code
    if hasattr(code, "co_qualname"):
        return code.co_qualname
    owner = frame.f_locals.get("self")
    return f"{type(owner).__name__}.{code.co_name}" if owner is not None else code.co_name


class _Provenance(TorchDispatchMode):
    """An op whose tensor inputs are all host makes host outputs (views, casts, cats of host tensors)."""

    def __init__(self, recorder: "CopyRecorder"):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if inputs and all(self.recorder.is_host(t) for t in inputs):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.recorder.host[t] = True
        return out


class CopyRecorder:
    """See the module docstring. `with CopyRecorder() as rec: ...`, then read `rec.copies`, `rec.events`."""

    def __init__(self):
        self.events: list = []
        self.calls: dict[str, int] = {}  # allowed helper -> times called
        self.host = WeakIdKeyDictionary()
        self.pinned = WeakIdKeyDictionary()
        self._via: list[str] = []
        self._saved: list = []
        self._stack = contextlib.ExitStack()

    # -- what was recorded ------------------------------------------------------------------------
    @property
    def copies(self) -> list[Copy]:
        return [e for e in self.events if isinstance(e, Copy)]

    def unexpected(self) -> list[Copy]:
        """Copies made outside every allowed helper, and non_blocking uploads from unpinned memory."""
        return [c for c in self.copies if c.via is None or c.error]

    def mark(self, name: str) -> None:
        self.events.append(Marker(name))

    # -- provenance -----------------------------------------------------------------------------
    def is_host(self, t: torch.Tensor) -> bool:
        return t in self.host or (t._base is not None and t._base in self.host)

    def is_pinned(self, t: torch.Tensor) -> bool:
        base = t._base if t._base is not None else t
        return t in self.pinned or base in self.pinned or t.is_pinned()

    def mark_host(self, *tensors: torch.Tensor) -> None:
        """These tensors, made before recording began, are on the host (a voice's x-vector and codes)."""
        for t in tensors:
            if t is not None:
                self.host[t] = True

    def mark_pinned(self, t: torch.Tensor) -> torch.Tensor:
        """`t` counts as pinned host memory (CPU-only torch cannot pin: tests pin with this)."""
        self.host[t] = True
        self.pinned[t] = True
        return t

    def _record(self, kind: str, api: str, blocking: bool, pinned: bool | None = None) -> None:
        where, _ = _caller()
        self.events.append(Copy(kind, api, blocking, where, self._via[-1] if self._via else None, pinned))

    # -- patching -------------------------------------------------------------------------------
    def _patch(self, owner, name: str, make) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, make(original))

    def allow(self, owner, name: str, via: str, uploads: bool = False, transfers: bool = False) -> None:
        """Copies inside `owner.name` are intended (`via`); `uploads`: its result is a device tensor;
        `transfers`: its result is a to_host handle whose `result()` calls are recorded as waits."""
        recorder = self

        def make(original):
            def allowed(*args, **kwargs):
                recorder.calls[via] = recorder.calls.get(via, 0) + 1
                recorder._via.append(via)
                try:
                    out = original(*args, **kwargs)
                finally:
                    recorder._via.pop()
                if uploads and isinstance(out, torch.Tensor):
                    if any(out is a for a in args):  # the CPU handed back the host tensor: keep the sides apart
                        out = out.clone()
                    recorder.host.pop(out, None)
                if transfers:
                    recorder._follow(out, via)
                return out
            return allowed

        self._patch(owner, name, make)

    def _follow(self, handle, via: str) -> None:
        where, _ = _caller()
        self.events.append(Transfer(id(handle), where, via))
        result, recorder = handle.result, self

        def waited():
            where, stack = _caller()
            recorder.events.append(Wait(id(handle), where, stack))
            recorder._via.append(via)
            try:
                return result()
            finally:
                recorder._via.pop()

        handle.result = waited

    def __enter__(self) -> "CopyRecorder":
        try:
            self._install()
        except BaseException:
            self.__exit__(None, None, None)  # no patch outlives a failed start
            raise
        return self

    def _install(self) -> None:
        rec = self

        def made_from_host(original, api):
            def make(data, *args, **kwargs):
                device = kwargs.get("device", args[1] if api == "torch.as_tensor" and len(args) > 1 else None)
                out = original(data, *args, **kwargs)
                if device is not None:
                    rec._record("upload", f"{api}(device=)", True)
                else:
                    rec.host[out] = True
                return out
            return make

        self._patch(torch, "tensor", lambda o: made_from_host(o, "torch.tensor"))
        self._patch(torch, "as_tensor", lambda o: made_from_host(o, "torch.as_tensor"))

        def from_numpy(original):
            def make(array):
                out = original(array)
                rec.host[out] = True
                return out
            return make

        self._patch(torch, "from_numpy", from_numpy)

        def factory(original):  # torch.zeros(n) with no device= is made on the host
            def make(*args, **kwargs):
                out = original(*args, **kwargs)
                if kwargs.get("device") is None and isinstance(out, torch.Tensor):
                    rec.host[out] = True
                return out
            return make

        for name in ("zeros", "ones", "empty", "full", "arange"):
            self._patch(torch, name, factory)

        def new_tensor(original):
            def make(self, data, *args, **kwargs):
                out = original(self, data, *args, **kwargs)
                if rec.is_host(self) and kwargs.get("device") is None:
                    rec.host[out] = True
                else:
                    rec._record("upload", "Tensor.new_tensor", True)
                return out
            return make

        self._patch(torch.Tensor, "new_tensor", new_tensor)

        def to(original):
            def move(self, *args, **kwargs):
                device, _, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
                if device is None and args and isinstance(args[0], torch.Tensor):
                    device = args[0].device
                host = rec.is_host(self)
                out = original(self, *args, **kwargs)
                if device is None:  # a cast: stays where it was
                    if host:
                        rec.host[out] = True
                elif host:
                    rec._record("upload", "Tensor.to(device)", not non_blocking, rec.is_pinned(self))
                    out = _apart(out, self)
                    rec.host.pop(out, None)
                elif _names_cpu(args, kwargs):
                    rec._record("download", "Tensor.to('cpu')", not non_blocking)
                    out = _apart(out, self)
                    rec.host[out] = True
                return out
            return move

        self._patch(torch.Tensor, "to", to)

        def cuda(original):
            def move(self, *args, **kwargs):
                if rec.is_host(self):
                    rec._record("upload", "Tensor.cuda", not kwargs.get("non_blocking", False), rec.is_pinned(self))
                return original(self, *args, **kwargs)
            return move

        self._patch(torch.Tensor, "cuda", cuda)

        def download(name):
            def wrap(original):
                def read(self, *args, **kwargs):
                    if not rec.is_host(self):
                        rec._record("download", f"Tensor.{name}", True)
                    out = original(self, *args, **kwargs)
                    if name in ("cpu", "pin_memory") and isinstance(out, torch.Tensor):
                        out = _apart(out, self)
                        rec.host[out] = True
                        if name == "pin_memory":
                            rec.pinned[out] = True
                    return out
                return read
            return wrap

        for name in ("cpu", "numpy", "tolist", "item", "__int__", "__float__", "__bool__", "__index__", "pin_memory"):
            self._patch(torch.Tensor, name, download(name))

        def copy_(original):
            def copy(self, src, non_blocking=False):
                to_host, from_host = rec.is_host(self), rec.is_host(src)
                if from_host and not to_host:
                    rec._record("upload", "Tensor.copy_", not non_blocking, rec.is_pinned(src))
                elif to_host and not from_host:
                    rec._record("download", "Tensor.copy_", not non_blocking)
                return original(self, src, non_blocking)
            return copy

        self._patch(torch.Tensor, "copy_", copy_)

        def setitem(original):
            def put(self, index, value):
                if isinstance(value, torch.Tensor) and rec.is_host(value) and not rec.is_host(self):
                    rec._record("upload", "Tensor.__setitem__", True, rec.is_pinned(value))
                elif isinstance(value, (bool, int, float)) and not rec.is_host(self) and self[index].dim() == 0:
                    rec._record("upload", "Tensor.__setitem__ (a number into one element)", True, False)
                return original(self, index, value)
            return put

        self._patch(torch.Tensor, "__setitem__", setitem)
        self._stack.enter_context(_Provenance(self))

    def __exit__(self, *exc) -> None:
        self._stack.close()
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()


def _apart(out: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """`out`, or a copy of it where the CPU handed back `source` itself: a copy between host and device
    makes a new tensor, and the two sides must not share a provenance."""
    return out.clone() if out is source else out


def _names_cpu(args, kwargs) -> bool:
    """Whether a `.to(...)` call names the CPU by a string (`.to("cpu")`: a download from the device;
    a `torch.device` is the engine's device here, which is the CPU in tests)."""
    return any(isinstance(value, str) and value.startswith("cpu") for value in list(args) + [kwargs.get("device")])
