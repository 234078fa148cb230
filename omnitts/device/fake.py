"""A CPU stand-in for CUDA/NPU graphs that enforces their rules, so tests can check the bookkeeping.

`FakeGraphBackend` is the accelerator backend (the same capture code as CUDA and NPU) running on a
fake device API. Rules a captured frame must obey, and how the fake enforces them:
  - no host sync during capture: `.item()`, `.tolist()`, `.numpy()`, `.cpu()`, `bool(t)`, `int(t)`,
    data-dependent shapes (`nonzero`, `unique`, `masked_select`, `x[mask]`, one-argument `where`,
    `repeat_interleave` by a tensor) raise `GraphRuleError`, at the Python call or, for those reached
    from C++, at the dispatcher;
  - no RNG during capture (noise is a counter-based hash computed in the frame): torch's sampling
    functions raise;
  - no tensor made from host data during capture (a real graph would bake the values in, or
    refuse the host-to-device copy): `torch.tensor`, `as_tensor`, `from_numpy`, `Tensor.new_tensor`
    raise (`torch.full` / `arange` / `zeros` with fixed sizes are fine);
  - no Python value that changes between replays: capture records the aten ops the frame runs
    with their non-tensor arguments (shapes, scalars, slices) and output shapes (`OpTrace`), and every replay re-runs
    the frame under the same recorder and raises if any op or argument differs (a real graph
    would silently replay the value seen at capture);
  - capture does not execute: the state the frame must leave as it was (`restore`: the slots' small
    per-row state) is restored after the capture run, as if nothing ran; the K/V writes stay, as a
    real warm-up's do (each row's next position, which the real frame writes again);
  - stable input addresses: every replay checks the tensors the graph reads (`inputs`) still live
    where they did at capture (a real graph would keep reading the old buffers);
  - outputs are overwritten on every replay: the output buffer is poisoned before each replay, so
    code relying on a stale output reads garbage.
Copies to the host are deferred as on a device: `to_host` snapshots on the "device" and converts
to numpy only in `result()`, so `no_host_sync()` can cover a whole engine step but its wait point.
"""

from __future__ import annotations

import contextlib
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from .accelerator import AcceleratorBackend
from .base import Backend


class GraphRuleError(RuntimeError):
    """Code under capture did something a real device graph cannot record."""


_SYNCS = ["item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero", "unique", "cpu"]
# The same syncs as the dispatcher sees them, reached from C++ too (`x[mask]`, one-argument `where`,
# `repeat_interleave` by a tensor of counts): a scalar read or an output whose size the data decides.
_SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.argwhere",
             "aten.unique", "aten._unique", "aten.repeat_interleave.Tensor", "aten.repeat_interleave.self_Tensor")
_TORCH_SYNCS = ["nonzero", "unique", "masked_select", "argwhere"]
_RNG_TENSOR = ["exponential_", "uniform_", "normal_", "random_", "bernoulli_", "geometric_", "cauchy_",
               "log_normal_"]
_RNG_TORCH = ["rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "multinomial",
              "bernoulli", "normal", "randperm", "poisson"]
_HOST_DATA_TORCH = ["tensor", "as_tensor", "from_numpy"]
_HOST_DATA_TENSOR = ["new_tensor"]


@contextlib.contextmanager
def graph_rules():
    """Within this block, host syncs, RNG calls and tensors made from host data raise GraphRuleError."""
    with _forbidden(syncs=True, rng=True, host_data=True):
        yield


@contextlib.contextmanager
def no_host_sync():
    """Within this block, host syncs raise GraphRuleError (the rule for host code around the frames)."""
    with _forbidden(syncs=True, rng=False, host_data=False):
        yield


@contextlib.contextmanager
def _forbidden(syncs: bool, rng: bool, host_data: bool):
    saved = []

    def forbid(owner, name, what):
        saved.append((owner, name, getattr(owner, name)))

        def refuse(*args, **kwargs):
            raise GraphRuleError(f"{what} `{name}` during graph capture")
        setattr(owner, name, refuse)

    groups = [(syncs, torch.Tensor, _SYNCS, "host sync"),
              (syncs, torch, _TORCH_SYNCS, "data-dependent shape (host sync)"),
              (rng, torch.Tensor, _RNG_TENSOR, "random number generation"),
              (rng, torch, _RNG_TORCH, "random number generation"),
              (host_data, torch, _HOST_DATA_TORCH, "tensor from host data"),
              (host_data, torch.Tensor, _HOST_DATA_TENSOR, "tensor from host data")]
    for wanted, owner, names, what in groups:
        for name in names if wanted else ():
            forbid(owner, name, what)
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


class OpTrace(TorchDispatchMode):
    """Records each aten op run under it with its non-tensor arguments and its outputs (tensors by dtype
    and shape); with `rules`, also refuses the syncs of `_SYNC_OPS` and indexing by a boolean mask.

    Two runs of a graph-safe frame give equal traces: anything a replay would not re-evaluate
    (a Python int that grows, a length read on the host, an output sized by the data) shows up as a
    differing argument or output.
    """

    def __init__(self, rules: bool = False):
        super().__init__()
        self.rules = rules
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.rules:
            _check_op(str(func), args)
        out = func(*args, **kwargs)
        self.ops.append((str(func), tree_map(_describe, args), tree_map(_describe, kwargs), tree_map(_describe, out)))
        return out


def _check_op(name: str, args) -> None:
    if name.startswith(_SYNC_OPS):
        raise GraphRuleError(f"host sync `{name}` during graph capture")
    if name.startswith(("aten.index.", "aten.index_put")) and len(args) > 1:
        masks = [i for i in args[1] if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
        if masks:
            raise GraphRuleError(f"host sync `{name}` by a boolean mask during graph capture")


def _describe(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape))
    return repr(value)  # ints, floats, slices, dtypes, devices: compared as written


def _first_difference(captured: list[tuple], replayed: list[tuple]) -> str | None:
    for i, (a, b) in enumerate(zip(captured, replayed)):
        if a != b:
            return f"op {i}: captured {a[0]}{a[1:]}, replayed {b[0]}{b[1:]}"
    if len(captured) != len(replayed):
        return f"captured {len(captured)} ops, replayed {len(replayed)}"
    return None


class FakeGraph:
    """Capture checks the rules, records the op trace and undoes its work; replay re-runs the
    function and checks it ran the very ops the capture recorded."""

    def __init__(self, fn, restore: list[torch.Tensor], output: torch.Tensor, inputs: list[torch.Tensor],
                 check_trace: bool = True):
        self.fn, self.restore, self.output, self.check_trace = fn, restore, output, check_trace
        self.inputs = inputs
        self.addresses = [t.data_ptr() for t in inputs]
        self.replays = 0
        self.trace: list[tuple] = []
        self.active = False  # inside capture or replay (tests check frames run nowhere else)

    @contextlib.contextmanager
    def capture(self):
        saved = [t.clone() for t in self.restore]
        self.active = True
        try:
            with graph_rules(), OpTrace(rules=True) as trace:
                yield
        finally:
            self.active = False
        self.trace = trace.ops
        for tensor, copy in zip(self.restore, saved):
            tensor.copy_(copy)

    def replay(self) -> None:
        moved = [i for i, t in enumerate(self.inputs) if t.data_ptr() != self.addresses[i]]
        if moved:
            raise GraphRuleError(f"state tensors {moved} were reallocated after capture; a real graph would not see them")
        self.output.fill_(-(2**40))  # poison: the replay must write every output it is read for
        self.active = True
        try:
            with OpTrace() if self.check_trace else contextlib.nullcontext() as trace:
                self.fn()
        finally:
            self.active = False
        difference = _first_difference(self.trace, trace.ops) if self.check_trace else None
        if difference is not None:
            raise GraphRuleError(f"replay {self.replays + 1} differs from the capture ({difference}): a Python "
                                 "value changed between replays, which a real graph would not see")
        self.replays += 1


class DeferredTransfer:
    """A device-to-host copy that completes in `result()` (the snapshot is taken at once, on the device)."""

    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor.detach().clone()

    def result(self):
        return self._tensor.numpy().copy()


class _Stream:
    def wait_stream(self, other) -> None:
        pass


def _fake_api():
    """The slice of the torch.cuda / torch.npu API the accelerator backend uses, on the CPU."""
    free = Backend().free_memory() or 0  # the CPU's, as the device's
    return types.SimpleNamespace(
        Stream=_Stream, current_stream=_Stream, stream=lambda s: contextlib.nullcontext(),
        graph_pool_handle=object, graph=lambda graph, pool=None: graph.capture(), synchronize=lambda: None,
        mem_get_info=lambda: (free, free), memory_reserved=lambda: 0, memory_allocated=lambda: 0,
    )


class FakeGraphBackend(AcceleratorBackend):
    """The accelerator backend's capture and replay code, on the CPU, with graph rules enforced."""

    name = "cpu"
    capture_fallback = False  # a graph-rule violation is raised, not run around

    def __init__(self, eager: bool = False, predictor_attention=None, check_trace: bool = True):
        """`check_trace=False` skips the per-replay trace comparison (about halves a replay's cost)."""
        super().__init__(eager=eager)
        self.check_trace = check_trace
        self.captured: list[FakeGraph] = []
        self._api = _fake_api()
        self._predictor_attention = predictor_attention

    def predictor_attention(self):
        return self._predictor_attention

    @property
    def api(self):
        return self._api

    def new_graph(self, fn, restore, output, inputs) -> FakeGraph:
        graph = FakeGraph(fn, restore, output, inputs, self.check_trace)
        self.captured.append(graph)
        return graph

    def to_host(self, tensor: torch.Tensor) -> DeferredTransfer:
        return DeferredTransfer(tensor)  # no pinned memory without a real accelerator
