"""The engine: continuous batching over preallocated slots, with deferred device-to-host copies.

    engine = Engine(ckpt, EngineConfig(max_num_seqs=16))
    engine.add(prompt, params)
    while engine.has_work():
        for seq in engine.step():
            ...  # seq.codes(), seq.finish_reason

One `step()`: admit waiting requests into free slots (each prompt prefilled on its own, see
runner.Prefills), launch one frame for every running slot, start copying that frame's codes to the
host, then read the *previous* step's codes (which have long arrived) and retire requests that hit
EOS or their budget. The host therefore learns about EOS one step late: a finished request runs at
most one extra frame, which is discarded, and its slot is reused at once.

The host does no per-frame sampling work: noise is computed inside the frame from each row's seed
and frame index. It only picks the frame's `sampling.FramePlan` from the running requests' known
parameters; frame steps exist per plan, made when a plan is first needed (their graphs per bucket, when a
frame first needs one).

On an asynchronous device everything before `_collect` only enqueues work (prefill, the frame's
replay, the copy); the one place the host waits is `_collect`, for the copy of the frame launched a
step earlier, while the device already runs this step's frame. Admission is capped at
`max_prefill_tokens` prompt positions per step, so a burst of new requests delays the running rows
by a bounded prefill per frame rather than one long one, and at `max_prefill_bytes` of estimated
prefill activations (`prefill_bytes`, from shapes on the host), so no prefill outgrows memory.
`plan` rejects, before anything runs, a request whose prompt alone would exceed that budget or
whose prompt plus frame budget exceeds the talker's `max_position_embeddings`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

PREFILL_BUDGET_BYTES = 2**30  # estimated activations of one prefill step at most (see prefill_bytes)

from .. import sampling
from ..device import Backend, get_backend
from ..errors import RequestError
from ..params import SamplingParams, fresh_seed
from ..text.prompt import Prompt, positions_problem, shorten
from .reference import predictor_cache, predictor_frame_cache
from .runner import ModelRunner, Prefills
from .scheduler import Scheduler, Sequence
from .state import SlotCache, SlotState, move_row


@dataclass
class EngineConfig:
    """Engine-wide settings (per-request ones live in SamplingParams)."""

    max_num_seqs: int = 8
    max_positions: int = 4096  # talker positions per slot: prompt + frames
    max_text_tokens: int = 1024  # trailing-text tokens per request (streaming text mode)
    device: str = "cpu"
    eager: bool = False  # never capture graphs (also: OMNITTS_EAGER=1)
    graph_buckets: tuple[int, ...] | None = None  # batch sizes given a graph (None: 1, 2, 4, ...)
    span_buckets: tuple[int, ...] | None = None  # attention spans given a graph (None: 256, 512, ...)
    # Prompt positions prefilled per step at most (one request always goes in): a burst of new
    # requests is spread over steps instead of holding the running rows back for one long prefill.
    max_prefill_tokens: int | None = 2048
    # Estimated bytes of one prefill step's activations at most (`prefill_bytes`; None: no limit).
    max_prefill_bytes: int | None = PREFILL_BUDGET_BYTES
    # Every frame at the full batch (max_num_seqs rows, the unused ones padding), graphs or eager: fixed
    # matrix shapes, so a row's values do not depend on how many run beside it (deterministic mode).
    full_batch: bool = False

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_positions < 16:
            raise ValueError(f"max_positions must be >= 16, got {self.max_positions}")
        if self.graph_buckets is not None and not all(int(b) >= 1 for b in self.graph_buckets):
            raise ValueError(f"graph_buckets must be batch sizes >= 1, got {list(self.graph_buckets)}")
        if self.span_buckets is not None and not all(int(b) >= 1 for b in self.span_buckets):
            raise ValueError(f"span_buckets must be position counts >= 1, got {list(self.span_buckets)}")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1 (or None: no limit), got {self.max_prefill_tokens}")
        if self.max_prefill_bytes is not None and self.max_prefill_bytes < 1:
            raise ValueError(f"max_prefill_bytes must be >= 1 (or None: no limit), got {self.max_prefill_bytes}")


def prefill_bytes(talker, rows: int, length: int, itemsize: int) -> int:
    """Estimated peak activations of prefilling `rows` prompts padded to `length` positions through
    talker config `talker` (one layer at a time): the (rows, L, L) boolean masks the runner builds,
    attention scores (rows, heads, L, L) and a float mask in float32 (the math attention path; fused
    kernels need less), and the layer's hidden, attention and MLP activations."""
    t = talker
    square = rows * length * length * (3 + 4 * t.num_attention_heads + 4)
    linear = rows * length * (4 * t.hidden_size + 2 * t.num_attention_heads * t.head_dim
                              + 3 * t.intermediate_size) * itemsize
    return square + linear


def plan(ckpt, positions: int, max_num_seqs: int, text_tokens: int, kv_budget_bytes: int,
         device: str = "cpu", eager: bool = False, graph_buckets=None, span_buckets=None,
         max_prefill_tokens: int | None = EngineConfig.max_prefill_tokens, prompt_positions: int = 0,
         prefill_budget_bytes: int | None = PREFILL_BUDGET_BYTES, full_batch: bool = False,
         longest_part: str = "text") -> EngineConfig:
    """Size an engine for requests needing up to `positions` talker positions and `text_tokens` of text.

    The talker K/V cache is the big allocation (layers x 2 x slots x kv_heads x positions x head_dim);
    slots are reduced until it fits `kv_budget_bytes`. Raises RequestError if not even one fits, if
    `positions` exceed the talker's `max_position_embeddings`, or if prefilling the longest prompt
    (`prompt_positions`) alone is estimated over `prefill_budget_bytes` (`prefill_bytes`); a prompt too long is
    named by `longest_part`, the request field that makes most of it (`Prompt.longest_part`).
    """
    t = ckpt.config.talker
    itemsize = ckpt.cache_dtype.itemsize
    if positions > t.max_position_embeddings:
        raise RequestError(positions_problem(longest_part, positions, t.max_position_embeddings))
    prefill = prefill_bytes(t, 1, prompt_positions, ckpt.model.talker.dtype.itemsize)
    if prefill_budget_bytes is not None and prefill > prefill_budget_bytes:
        raise RequestError(f"{longest_part}: a prompt of {prompt_positions} positions needs about "
                           f"{prefill / 2**30:.1f} GiB to prefill, over the {prefill_budget_bytes / 2**30:.1f} GiB "
                           f"budget; {shorten(longest_part)}")
    # Round up: fewer distinct shapes, a little headroom (never past the model's positions).
    positions = min(-(-positions // 64) * 64, t.max_position_embeddings)
    per_slot = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * positions * itemsize
    slots = min(max_num_seqs, kv_budget_bytes // per_slot)
    if slots < 1:
        raise RequestError(f"max_frames: one request needs {positions} positions ({per_slot / 2**30:.1f} GiB of "
                           f"talker cache), over the {kv_budget_bytes / 2**30:.1f} GiB budget; lower max_frames "
                           "or raise the cache budget")
    return EngineConfig(max_num_seqs=int(slots), max_positions=positions, max_text_tokens=max(text_tokens, 1),
                        device=device, eager=eager,
                        graph_buckets=None if graph_buckets is None else tuple(graph_buckets),
                        span_buckets=None if span_buckets is None else tuple(span_buckets),
                        max_prefill_tokens=max_prefill_tokens, max_prefill_bytes=prefill_budget_bytes,
                        full_batch=full_batch)


class Engine:
    def __init__(self, ckpt, config: EngineConfig | None = None, backend: Backend | None = None):
        self.ckpt = ckpt
        self.config = config = config or EngineConfig()
        cfg = ckpt.config
        tcfg, pcfg = cfg.talker, cfg.predictor
        dtype = ckpt.model.talker.dtype
        self.vocabs = (tcfg.vocab_size, pcfg.vocab_size)
        self.eos = tcfg.codec_eos_token_id
        self.state = SlotState(config.max_num_seqs, cfg, config.max_text_tokens, dtype, ckpt.device)
        self.cache = SlotCache(tcfg.num_hidden_layers, config.max_num_seqs, tcfg.num_key_value_heads,
                               config.max_positions, tcfg.head_dim, ckpt.cache_dtype, ckpt.device)
        self.backend = backend or get_backend(config.device, eager=config.eager)
        # The code predictor's frame cache: preallocated (reused every frame), fixed-shape with the
        # backend's kernel where it has one (NPU).
        attend = self.backend.predictor_attention()
        if attend is None:
            predictor = predictor_frame_cache(ckpt.model.talker, config.max_num_seqs)
        else:
            predictor = predictor_cache(ckpt.model.talker, config.max_num_seqs, attend)
        self.runner = ModelRunner(ckpt, self.state, self.cache, predictor)
        self.prefills = Prefills(self.runner, self.backend, config.max_positions)
        self.steps: dict[sampling.FramePlan, object] = {}  # frame steps per plan (see `_steps`)
        self.pool = None  # the memory pool every graph of this engine shares (made with the first plan's steps)
        self.scheduler = Scheduler(config.max_num_seqs)
        self.pending = None  # (host copy of the last launched frame, the sequences of its rows)
        self.next_id = 0
        self.steps_run = 0
        # Told of each request as it is admitted, before its prefill runs (the pipeline tells the output
        # directory's claims, so that a crash in that very step is counted against the items admitted).
        self.on_admit: Callable[[Sequence], None] | None = None

    # -- requests -------------------------------------------------------------------------------
    def add(self, prompt: Prompt, params: SamplingParams, tag=None) -> Sequence:
        """Queue a prompt; it is admitted as soon as a slot is free."""
        params = params.with_budget(prompt.text_tokens)
        length, text = prompt.embeds.shape[0], prompt.trailing.shape[0]
        if length + params.max_frames + 1 > self.config.max_positions:  # +1: the discarded overshoot frame
            raise RequestError(f"max_frames: prompt ({length} positions) + {params.max_frames} frames exceeds "
                               f"the engine's max_positions={self.config.max_positions}; lower max_frames or "
                               "raise max_positions")
        if text > self.config.max_text_tokens:
            raise RequestError(f"text: {text} trailing text tokens exceed max_text_tokens="
                               f"{self.config.max_text_tokens}; split the text or raise the limit")
        if params.samples and params.seed is None:
            params = replace(params, seed=fresh_seed())  # drawn once here; seq.params records it
        seq = Sequence(self.next_id, prompt, params, tag)
        self.next_id += 1
        self.scheduler.add(seq)
        return seq

    def drop_waiting(self, which=None) -> list[Sequence]:
        """Forget queued requests that were never admitted (they have not started), all of them or those
        for which `which(seq)` is true; returns them."""
        waiting, dropped, kept = self.scheduler.waiting, [], []
        for seq in waiting:
            (dropped if which is None or which(seq) else kept).append(seq)
        waiting.clear()
        waiting.extend(kept)
        return dropped

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self.pending is not None

    # -- the loop -------------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """Run one frame for every running request; return the requests that finished."""
        self._admit()
        launched = None
        running = list(self.scheduler.running)
        # A sequence with its whole frame budget launched needs no frame; when none needs one (the end of
        # a run, or a request alone), no frame runs: only the copy in flight is collected.
        if running and all(seq.launched >= seq.params.max_frames for seq in running):
            running = []
        if running:
            span = max(self.cache_lengths(running)) + 1  # positions this frame attends to
            for seq in running:
                seq.launched += 1
            self.steps_for([seq.params for seq in running]).run(len(running), span)
            launched = (self.backend.to_host(self.state.codes[: len(running)]), running)
        finished = self._collect(self.pending) if self.pending is not None else []
        self.pending = launched
        self.steps_run += 1
        return finished

    def run(self):
        """Step until every queued request has finished, yielding them as they do."""
        while self.has_work():
            yield from self.step()

    def cache_lengths(self, seqs: list[Sequence]) -> list[int]:
        """Talker positions each sequence will have filled before this step (known without a sync)."""
        return [seq.prompt.embeds.shape[0] + seq.launched for seq in seqs]

    def _admit(self) -> None:
        new = self.scheduler.admit(self.config.max_prefill_tokens, self._prefill_fits)
        if not new:
            return
        state = self.state
        for seq in new:
            if self.on_admit is not None:
                self.on_admit(seq)
            seq.admitted_at = self.steps_run
            row = seq.slot
            state.reset(row)
            state.params.set(row, seq.params)
            state.load_text(row, seq.prompt.trailing.to(state.trailing.dtype), seq.prompt.pad.to(state.trailing.dtype))
        self.prefills.run(new[0].slot, [seq.prompt.embeds for seq in new])

    def _prefill_fits(self, rows: int, longest: int) -> bool:
        """Whether prefilling `rows` prompts padded to `longest` positions stays within the budget."""
        budget = self.config.max_prefill_bytes
        return budget is None or prefill_bytes(self.ckpt.config.talker, rows, longest,
                                               self.ckpt.model.talker.dtype.itemsize) <= budget

    def steps_for(self, params: list[SamplingParams]):
        """The frame steps a batch of requests with these parameters runs (see `_steps`)."""
        return self._steps(sampling.FramePlan.of(params, *self.vocabs))

    def _steps(self, plan: sampling.FramePlan):
        """The frame steps for `plan`, made the first time a batch needs it (graphs are captured per
        bucket as frames need them, see device.base.GraphSteps).

        Plans are coarse (candidate counts are powers of two), so a run sees a handful: typically
        one for its sampled requests and one for greedy-only batches. All of them capture into one
        memory pool, the engine's.
        """
        if plan not in self.steps:
            c = self.config
            if self.pool is None:
                self.pool = self.backend.graph_pool()
            self.steps[plan] = self.backend.frame_steps(_Planned(self.runner, plan), c.max_num_seqs, c.max_positions,
                                                        self.state.written(), self.state.codes, c.graph_buckets,
                                                        c.span_buckets, self.pool, self._device_state(),
                                                        full_batch=c.full_batch)
        return self.steps[plan]

    def graph_stats(self) -> dict:
        """What graph capture has cost this engine so far: frame graphs captured, eager warm-up frames,
        seconds; prefill graphs (`prefill_captures`, `prefill_capture_seconds`) apart."""
        steps = self.steps.values()
        return {"captures": sum(s.captures for s in steps), "warmup_frames": sum(s.warmup_frames for s in steps),
                "capture_seconds": sum(s.capture_seconds for s in steps),
                "prefill_captures": self.prefills.captures, "prefill_capture_seconds": self.prefills.capture_seconds}

    def _collect(self, pending) -> list[Sequence]:
        """Read a launched frame's codes; retire sequences that ended (EOS or budget)."""
        transfer, seqs = pending
        codes = transfer.result()  # (B, 16) int64 numpy
        finished = []
        for row, seq in enumerate(seqs):
            if seq.finished:
                continue  # the overshoot frame of a sequence that ended one step earlier
            if int(codes[row, 0]) == self.eos:
                seq.finish_reason = "eos"
            else:
                seq.frames.append(codes[row].copy())
                if len(seq.frames) >= seq.params.max_frames:
                    seq.finish_reason = "length"
            if seq.finished:
                seq.finished_at = self.steps_run
                finished.append(seq)
                moved = self.scheduler.release(seq)
                if moved is not None:  # the last running request moved into the freed slot
                    src, dst = moved
                    move_row(self.state.per_row(), src, dst)
                    # Its positions so far, the frame in flight included (queued before this copy).
                    self.cache.move_row(src, dst, self.cache_lengths([self.scheduler.running[dst]])[0])
        return finished

    def _device_state(self) -> list:
        return self.state.per_row() + [self.state.codes] + self.cache.tensors()


class _Planned:
    """The runner with a fixed sampling plan: what a backend's frame steps call (and capture)."""

    def __init__(self, runner: ModelRunner, plan: sampling.FramePlan):
        self.runner, self.plan = runner, plan

    def frame(self, batch: int, span: int) -> None:
        self.runner.frame(batch, span, self.plan)
