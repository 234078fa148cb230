"""Which request runs in which slot: a waiting queue and a prefix of running slots.

Running sequences occupy slots 0..n-1 in order. A new request is admitted into slot n as soon as
there is room; a finished one frees its slot at once by moving the last running sequence into it
(the caller moves the device rows the same way). No device data is read here.

Admission is first come, first served, until the caller says no more requests will come
(`longest_first`): from then on the waiting request with the largest frame budget goes first. While
requests keep arriving every slot stays busy whatever the order; at the end, a long request admitted
last would run on alone in an emptying batch (32 requests of 20-100 frames at 8 slots: 293 steps in
arrival order, 243 longest first; the ideal is 240).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..params import SamplingParams
from ..text.prompt import Prompt


@dataclass(eq=False)
class Sequence:
    """One request inside the engine."""

    id: int
    prompt: Prompt
    params: SamplingParams
    tag: object = None  # the caller's handle (e.g. the Request), returned untouched
    frames: list[np.ndarray] = field(default_factory=list)
    finish_reason: str | None = None
    slot: int | None = None
    launched: int = 0  # frames launched for this sequence (known to the host without a sync)
    admitted_at: int | None = None  # engine step numbers, for progress and tests
    finished_at: int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def codes(self) -> np.ndarray:
        return np.stack(self.frames) if self.frames else np.zeros((0, 16), dtype=np.int64)


class Scheduler:
    def __init__(self, max_num_seqs: int):
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.longest_first = False  # set once nothing more will be added (see the module docstring)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def admit(self, max_tokens: int | None = None, fits=None) -> list[Sequence]:
        """Move waiting sequences into free slots (appended after the running prefix), in admission
        order, while their prompts total at most `max_tokens` positions (None: no limit) and
        `fits(rows, longest)` (the prefill's memory estimate, None: no check) holds for the batch
        prefilled together; the first always goes in."""
        admitted, tokens, longest = [], 0, 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            index = self._next_index()
            length = self.waiting[index].prompt.embeds.shape[0]
            tokens, longest = tokens + length, max(longest, length)
            if admitted and ((max_tokens is not None and tokens > max_tokens)
                             or (fits is not None and not fits(len(admitted) + 1, longest))):
                break
            seq = self.waiting[index]
            del self.waiting[index]
            seq.slot = len(self.running)
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def _next_index(self) -> int:
        """Where in `waiting` the next admitted sequence is: the front, or (`longest_first`) the first
        of those with the largest frame budget."""
        if not self.longest_first:
            return 0
        budgets = [seq.params.max_frames for seq in self.waiting]
        return budgets.index(max(budgets))

    def release(self, seq: Sequence) -> tuple[int, int] | None:
        """Free `seq`'s slot. Returns (src, dst) if the last running sequence moved into it."""
        slot = seq.slot
        last = self.running.pop()
        seq.slot = None
        if last is seq:
            return None
        self.running[slot] = last
        last.slot = slot
        return len(self.running), slot
