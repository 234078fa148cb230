"""What goes through the pipeline: a `Job` in, an `Outcome` out, and a job's state while it runs (`JobState`:
its pieces, their budgets and seeds, where its joined audio goes, the outcome it ends in)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import RequestError
from ..params import FRAMES_PER_SECOND, SamplingParams, derive_seed, frames_in, share_frames, share_problem
from ..request import Request
from .join import StreamJoiner


@dataclass
class Job:
    """One item to synthesize: what to say, how to sample, and the caller's handle (`key`)."""

    request: Request
    params: SamplingParams
    key: object = None
    prompt: object = None  # an already built Prompt (then the text is not split)
    alone: bool = False  # run with no other item in the engine (its process died while it ran beside others)
    fail: str | None = None  # fail at once with this message, nothing run (its process died while it ran alone)


@dataclass
class Outcome:
    """A finished job: `result` (an `Audio`) or an `error` message."""

    job: Job
    result: object = None
    error: str | None = None
    exception: Exception | None = None  # what raised `error`
    seed: int | None = None  # the item's seed (assigned when the job had none and samples)
    seeds: list | None = None  # the seed each piece's kept attempt sampled with (derived from `seed`)
    attempts: int = 1  # 1 + runaway retries
    pieces: int = 1  # requests the text was split into
    timings: dict = field(default_factory=dict)  # seconds: prepare, generate, decode, total
    sink: object = None  # with a pipeline `sink`: the item's finished, uncommitted AudioSink
    seconds: float = 0.0  # audio length
    samples: int = 0  # audio length in samples

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(eq=False)
class JobState:
    """A job in flight (the pipeline's): its pieces' prompts, finished pieces and bookkeeping."""

    job: Job
    params: SamplingParams
    seed: int | None
    pieces: list = field(default_factory=list)  # (Request, Prompt) per piece
    shares: list | None = None  # frames per piece of an explicit budget shared by several pieces
    done: dict = field(default_factory=dict)  # piece index -> (codes, finish_reason)
    joiner: StreamJoiner | None = None  # pieces' audio -> the item's audio, in order
    chunks: list = field(default_factory=list)  # the joined audio so far (without a sink)
    sink: object = None
    incremental: bool = True  # audio may leave before its piece ends (False if a retry could undo it)
    tries: dict = field(default_factory=dict)  # piece index -> runaway retries so far
    dropped: bool = False
    admitted: bool = False  # a request of it has been admitted (`started` was told)
    suspect: bool = False  # running again, alone among suspects, after an engine step failed with it
    involved: int = 0  # engine failures it shared (it fails at MAX_INVOLVED, however the blame fell)
    started: float = field(default_factory=time.perf_counter)
    prepare_s: float = 0.0
    decode_s: float = 0.0
    first_added: float | None = None

    def ready_entries(self) -> list:
        """The pipeline's `ready` entries, (item, piece index, params), for every piece of this item."""
        return [(self, index, self.piece_params(index)) for index in range(len(self.pieces))]

    def emit(self, chunk: np.ndarray) -> None:
        """Joined audio of this item that is final (its joiner's output): to its sink (made when the item was
        prepared), or kept."""
        if self.sink is None:
            self.chunks.append(chunk)
            return
        self.sink.write(chunk)

    def outcome(self, rate: int, in_sink: bool) -> Outcome:
        """The finished item's `Outcome`: its pieces' codes joined, its audio (`in_sink`: in its sink's file,
        which the caller commits; else the chunks kept), its seeds, attempts and timings."""
        from ..result import Audio

        parts = [self.done[i] for i in range(len(self.pieces))]
        codes = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        reason = "length" if any(p[1] == "length" for p in parts) else "eos"
        if not in_sink:
            samples = np.concatenate(self.chunks) if self.chunks else np.zeros(0, dtype=np.float32)
            count, sink = len(samples), None
        else:  # the audio is in the sink's file; the caller commits it
            sink = self.sink
            samples, count = None, sink.samples
        result = Audio(samples, rate, codes, reason, self.job.request.id, seed=self.seed)
        now = time.perf_counter()
        timings = {"prepare": self.prepare_s, "generate": now - (self.first_added or now) - self.decode_s,
                   "decode": self.decode_s, "total": now - self.started}
        attempts = 1 + max(self.tries.values(), default=0)
        seeds = None if self.seed is None else [self.piece_seed(i) for i in range(len(self.pieces))]
        return Outcome(self.job, result, seed=self.seed, seeds=seeds, attempts=attempts, pieces=len(self.pieces),
                       timings={k: round(v, 4) for k, v in timings.items()}, sink=sink, seconds=count / rate,
                       samples=count)

    def piece_params(self, index: int) -> SamplingParams:
        """How piece `index` samples: its seed (`piece_seed`), its share of an explicit budget, a definite
        frame budget."""
        request, prompt = self.pieces[index]
        params = replace(self.params, seed=self.piece_seed(index))
        if self.shares is not None:
            params = replace(params, max_frames=self.shares[index])
        return params.with_budget(prompt.text_tokens, request.max_seconds)

    def piece_seed(self, index: int) -> int | None:
        """Piece 0 keeps the item's seed; later pieces and runaway retries derive theirs from it.

        A retry reruns only the piece that ran away, so the pieces of one item stay independent.
        """
        seed = derive_seed(self.seed, "piece", index)
        retries = self.tries.get(index, 0)
        if seed is not None and retries:
            seed = derive_seed(seed, "retry", retries)
        return seed

    def budget_shares(self) -> list[int] | None:
        """The frames each piece gets from its explicit budget (None: no explicit budget, or
        one piece). RequestError when the budget is smaller than the number of pieces."""
        request, params = self.job.request, self.params
        if len(self.pieces) < 2 or (params.max_frames is None and request.max_seconds is None):
            return None
        # The whole item's budget (each share is then capped at frame_cap, as one utterance is).
        total = params.max_frames
        if total is None:
            total = frames_in(request.max_seconds)
        if problem := share_problem("max_frames" if params.max_frames is not None else "max_seconds", total,
                                    len(self.pieces)):
            raise RequestError(problem)
        return share_frames(total, [prompt.text_tokens for _, prompt in self.pieces])

    def budget_warning(self) -> str | None:
        """What to warn of when the job's explicit budget gives a piece more frames than one utterance of the
        checkpoint takes (`frame_cap`, from generation_config.json's max_new_tokens): the piece stops there, so
        the budget asked for is not what it gets (its record's finish_reason `length` is the cap's). None else."""
        request, params = self.job.request, self.params
        if params.max_frames is None and request.max_seconds is None:
            return None  # the derived budget is capped by design (docs/outputs.md)
        most = max(self.shares) if self.shares is not None else (
            params.max_frames if params.max_frames is not None else frames_in(request.max_seconds))
        if most <= params.frame_cap:
            return None
        cap = params.frame_cap
        asked = f"max_frames: {params.max_frames}" if params.max_frames is not None else \
            f"max_seconds: {request.max_seconds:g} s"
        return (f"{asked} is more than one utterance of this checkpoint takes: a piece stops at {cap} frames "
                f"({cap / FRAMES_PER_SECOND:g} s: generation_config.json's max_new_tokens - 1), finish_reason length")


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (a record's `error` is one line)."""
    return " ".join(str(exc).split()) or "(no message)"


def since(start: float) -> float:
    return time.perf_counter() - start
