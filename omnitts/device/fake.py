"""A CPU stand-in for CUDA/NPU graphs that enforces their rules, so tests can check the bookkeeping.

`FakeGraphBackend` is the accelerator backend (the same capture code as CUDA and NPU) running on a
fake device API. Rules a captured frame must obey, and how the fake enforces them:
  - no host sync during capture: `.item()`, `.tolist()`, `.numpy()`, `bool(t)`, `int(t)`,
    data-dependent shapes (`nonzero`, `unique`, `masked_select`) raise `GraphRuleError`;
  - no RNG during capture (noise is a counter-based hash computed in the frame): torch's sampling
    functions raise;
  - capture does not execute: the slot state is restored after the capture run, as if nothing ran;
  - stable input addresses: every replay checks the state tensors still live where they did at
    capture (a real graph would keep reading the old buffers);
  - outputs are overwritten on every replay: the output buffer is poisoned before each replay, so
    code relying on a stale output reads garbage.
"""

from __future__ import annotations

import contextlib
import types

import torch

from .accelerator import AcceleratorBackend
from .base import Backend


class GraphRuleError(RuntimeError):
    """Code under capture did something a real device graph cannot record."""


_SYNCS = ["item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero", "unique"]
_TORCH_SYNCS = ["nonzero", "unique", "masked_select", "argwhere"]
_RNG_TENSOR = ["exponential_", "uniform_", "normal_", "random_", "bernoulli_", "geometric_", "cauchy_",
               "log_normal_"]
_RNG_TORCH = ["rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "multinomial",
              "bernoulli", "normal", "randperm", "poisson"]


@contextlib.contextmanager
def graph_rules():
    """Within this block, host syncs and RNG calls raise GraphRuleError."""
    saved = []

    def forbid(owner, name, what):
        saved.append((owner, name, getattr(owner, name)))

        def refuse(*args, **kwargs):
            raise GraphRuleError(f"{what} `{name}` during graph capture")
        setattr(owner, name, refuse)

    for name in _SYNCS:
        forbid(torch.Tensor, name, "host sync")
    for name in _TORCH_SYNCS:
        forbid(torch, name, "data-dependent shape (host sync)")
    for name in _RNG_TENSOR:
        forbid(torch.Tensor, name, "random number generation")
    for name in _RNG_TORCH:
        forbid(torch, name, "random number generation")
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


class FakeGraph:
    """Records nothing: capture checks the rules and undoes its work; replay re-runs the function."""

    def __init__(self, fn, state: list[torch.Tensor], output: torch.Tensor):
        self.fn, self.state, self.output = fn, state, output
        self.addresses = [t.data_ptr() for t in state]
        self.replays = 0

    @contextlib.contextmanager
    def capture(self):
        saved = [t.clone() for t in self.state]
        with graph_rules():
            yield
        for tensor, copy in zip(self.state, saved):
            tensor.copy_(copy)

    def replay(self) -> None:
        moved = [i for i, t in enumerate(self.state) if t.data_ptr() != self.addresses[i]]
        if moved:
            raise GraphRuleError(f"state tensors {moved} were reallocated after capture; a real graph would not see them")
        self.output.fill_(-(2**40))  # poison: the replay must write every output it is read for
        self.fn()
        self.replays += 1


class _Stream:
    def wait_stream(self, other) -> None:
        pass


def _fake_api():
    """The slice of the torch.cuda / torch.npu API the accelerator backend uses, on the CPU."""
    return types.SimpleNamespace(
        Stream=_Stream, current_stream=_Stream, stream=lambda s: contextlib.nullcontext(),
        graph_pool_handle=object, graph=lambda graph, pool=None: graph.capture(),
    )


class FakeGraphBackend(AcceleratorBackend):
    """The accelerator backend's capture and replay code, on the CPU, with graph rules enforced."""

    name = "cpu"

    def __init__(self, eager: bool = False, predictor_attention=None):
        super().__init__(eager=eager)
        self.captured: list[FakeGraph] = []
        self._api = _fake_api()
        self._predictor_attention = predictor_attention

    def predictor_attention(self):
        return self._predictor_attention

    @property
    def api(self):
        return self._api

    def new_graph(self, fn, state, output) -> FakeGraph:
        graph = FakeGraph(fn, state, output)
        self.captured.append(graph)
        return graph

    to_host = Backend.to_host  # plain copies: pinned memory needs a real accelerator
