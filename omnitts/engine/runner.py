"""The model side of the engine: batched prefill, and one whole frame for a batch of slots.

`frame` is the hot path: choose codebook 0 from the pending logits, run the code predictor's 15
steps, embed the frame, add each row's next trailing-text embedding and run one talker step to get
the next logits. It reads and writes only preallocated state (the slot prefix 0..batch-1), takes
its randomness from counter-based noise (a hash of each row's seed and frame index, see
omnitts.sampling) and makes no host sync, so a device backend can capture it whole as one graph per
batch size and sampling plan (`sampling.FramePlan`: the warping the batch needs, known on the host).
Prefill (`Prefills`) runs each prompt in its own shape eagerly, or, on accelerators outside float32,
padded at its end to one of a few lengths, each captured as a graph.
"""

from __future__ import annotations

import torch

from .. import sampling
from ..device.copies import upload
from ..models.kv_cache import FrameKVCache, StaticKVCache
from .reference import predict_residuals
from .state import SlotCache, SlotState

# Prompt lengths a padded prefill rounds up to (each one graph); a longer prompt is prefilled in its own
# shape (its launches are few against its work). CustomVoice and VoiceDesign prompts in streaming text mode
# are ~10 positions; non-streaming text and in-context cloning (reference codes) make them longer.
PREFILL_BUCKETS = (16, 32, 64, 128, 256, 512)


class PrefillInputs:
    """What a padded prefill reads and writes besides the slots, at fixed addresses (a graph's inputs): one
    prompt's embeddings padded with zeros, the slot it goes to, its length, and its next logits."""

    def __init__(self, length: int, hidden: int, vocab: int, dtype, device):
        self.embeds = torch.zeros((1, length, hidden), dtype=dtype, device=device)
        self.row = torch.zeros(1, dtype=torch.long, device=device)
        self.last = torch.zeros(1, dtype=torch.long, device=device)  # the prompt's last position
        self.length = torch.zeros(1, dtype=torch.long, device=device)
        self.logits = torch.zeros((1, vocab), dtype=torch.float32, device=device)

    def tensors(self) -> list[torch.Tensor]:
        return [self.embeds, self.row, self.last, self.length, self.logits]


class ModelRunner:
    def __init__(self, ckpt, state: SlotState, cache: SlotCache,
                 predictor_cache: FrameKVCache | StaticKVCache | None = None):
        self.ckpt = ckpt
        self.predictor_cache = predictor_cache  # the predictor's frame cache (None: a growing one per frame)
        self.talker = ckpt.model.talker
        self.state = state
        self.cache = cache
        tcfg = ckpt.config.talker
        self.eos = tcfg.codec_eos_token_id
        self.suppress = upload(sampling.talker_mask(tcfg.vocab_size, tcfg.codec_eos_token_id), ckpt.device)
        # Rotary tables made now, outside any graph capture: the talker's for every cache position
        # (gathered per frame), the code predictor's for its G positions (views per step).
        dtype = state.hidden.dtype
        self.rope = self.talker.model.rope_table(cache.capacity, dtype, ckpt.device)
        self.talker.code_predictor.model.rope_table(tcfg.num_code_groups, dtype, ckpt.device)

    @torch.inference_mode()
    def prefill(self, start: int, prompts: list[torch.Tensor]) -> None:
        """Prompts (L_i, D) into rows start..start+n: K/V written, next logits and hidden stored.

        One forward per prompt, over exactly its own positions: a batched prefill pads the prompts to
        the longest, and the padded attention (more keys, other GEMM shapes) and the linears over more
        rows round a row's values differently from the same prompt prefilled alone, so a request's
        codes would depend on who was admitted with it (issue 35). Prefill is eager and a small part of
        a request's work; the frames, where the time goes, stay batched.
        """
        dev, dtype = self.ckpt.device, self.state.hidden.dtype
        n = len(prompts)
        # Pinned and non_blocking (`copies.upload`): a plain host-to-device copy would wait for the frame
        # still running, and so would a non_blocking one from unpinned memory (torch_npu syncs the stream).
        lengths = upload(torch.tensor([p.shape[0] for p in prompts]), dev)
        last = []
        for i, p in enumerate(prompts):
            length = p.shape[0]
            self.cache.prefill(start + i, 1)
            hidden = self.talker(p.to(dev, dtype)[None], torch.arange(length, device=dev)[None], self.cache)
            last.append(hidden[0, length - 1])
        last = torch.stack(last)  # (n, D)
        rows = slice(start, start + n)
        self.state.hidden[rows] = last
        self.state.logits[rows] = self.talker.logits(last).float()
        self.state.lengths[rows] = lengths

    def load_prefill(self, inputs: PrefillInputs, row: int, prompt: torch.Tensor, bucket: int) -> None:
        """Stage `prompt` (L, D) for `prefill_padded(inputs, bucket)` into slot `row`: device copies and fills
        only (no host sync, no host data), so they queue behind the frame in flight."""
        length = prompt.shape[0]
        inputs.embeds[0, :length].copy_(prompt)
        inputs.embeds[0, length:bucket].zero_()  # finite padding: its keys land past the row's length, unread
        inputs.row.fill_(row)
        inputs.last.fill_(length - 1)
        inputs.length.fill_(length)

    @torch.inference_mode()
    def prefill_padded(self, inputs: PrefillInputs, bucket: int) -> None:
        """The staged prompt, padded at its end to `bucket` positions, into its slot: K/V of every position
        written (those past the prompt are overwritten by the frames before any frame attends to them), next
        logits and hidden stored. The attention is causal, so padding after the prompt changes none of its
        positions' inputs; the matrix products' shapes do, so a prompt is always padded to the same bucket,
        graph or eager. Fixed shapes and device-side indices: capturable once per bucket."""
        state, talker = self.state, self.talker
        self.cache.prefill_row(inputs.row)
        hidden = talker(inputs.embeds[:, :bucket], None, self.cache, rope=self.rope.span(0, bucket, 1))
        last = hidden[0].index_select(0, inputs.last)  # (1, D)
        inputs.logits.copy_(talker.logits(last).float())
        state.hidden.index_copy_(0, inputs.row, last)
        state.logits.index_copy_(0, inputs.row, inputs.logits)
        state.lengths.index_copy_(0, inputs.row, inputs.length)

    @torch.inference_mode()
    def frame(self, batch: int, span: int, plan: sampling.FramePlan) -> None:
        """Advance rows 0..batch-1 by one frame; the frame's codes land in `state.codes[:batch]`.

        `plan` must cover every row's parameters (`FramePlan.of` over the running requests).
        """
        s, talker = self.state, self.talker
        rows = slice(0, batch)
        p = s.params
        logits = sampling.process_talker(s.logits[rows], s.seen[rows], p.penalty[rows], s.generated[rows],
                                         self.suppress, self.eos)
        keys = (talker.frame_keys or sampling.frame_keys)(p.seed[rows], s.generated[rows]) if plan.samples else None
        c0 = sampling.choose(logits, p.do_sample[rows], p.temperature[rows], p.top_k[rows], p.top_p[rows],
                             keys, 0, plan.talker, talker.gumbel_scores, talker.pick)
        codes = predict_residuals(talker, s.hidden[rows], c0, p.select(rows), keys, plan.predictor,
                                  frame_cache=self.predictor_cache)  # (B, 16)
        s.codes[rows] = codes
        s.seen[rows].scatter_(1, c0[:, None], True)  # (one_hot would check values: a host sync)
        # Trailing text token k joins frame k's embedding; past the text, the stored tts_pad does.
        index = torch.minimum(s.generated[rows], s.trailing_len[rows])
        text = s.trailing[rows][torch.arange(batch, device=c0.device), index]
        s.generated[rows] += 1
        x = (talker.embed_frame(codes) + text).unsqueeze(1)  # (B, 1, D)
        positions = s.lengths[rows].clamp(max=self.cache.capacity - 1)  # padding rows never overflow
        keys = torch.arange(span, device=c0.device)
        mask = (keys[None, :] <= positions[:, None])[:, None, None]  # (B, 1, 1, span)
        self.cache.decode(batch, positions, span)
        hidden = talker(x, None, self.cache, mask, rope=self.rope.at(positions[:, None]))[:, 0]
        s.lengths[rows] = positions + 1
        s.hidden[rows] = hidden
        s.logits[rows] = talker.logits(hidden).float()


class Prefills:
    """How an engine prefills the prompts it admits.

    In their own shapes, eagerly (`ModelRunner.prefill`): on the CPU and in float32 (the parity runs). On an
    accelerator otherwise (`Backend.pads_prefill`), an eager prefill costs its launches on the host, ~20 ms
    for 28 layers through Triton's launcher, about what a whole frame costs the device; so a prompt of up
    to `PREFILL_BUCKETS[-1]` positions is padded to the smallest bucket that holds it and runs as that
    bucket's graph, captured the first time a prompt needs it (`device.base.CallGraphs`: its own pool, on
    the frames' stream; a refused capture: one warning, eager padded prefills). Eager mode (`--eager`) pads
    the same, so graphs and eager runs compute the same shapes. One prompt per call: a prompt's values never
    depend on what was admitted with it (issue 35). `padded` and `alone` count the prefills each way.
    """

    def __init__(self, runner: ModelRunner, backend, capacity: int):
        self.runner = runner
        state = runner.state
        self.pad = backend.pads_prefill(state.hidden.dtype)
        self.buckets = sorted({min(b, capacity) for b in PREFILL_BUCKETS})
        self.graphs = backend.call_graphs("prefill", own_stream=False) if self.pad else None
        self.by_bucket: dict[int, object] = {}  # bucket -> its graph (None: refused, runs eagerly)
        self.inputs: PrefillInputs | None = None  # made with the first padded prefill
        self.padded = self.alone = 0

    @property
    def captures(self) -> int:
        return self.graphs.captures if self.graphs is not None else 0

    @property
    def capture_seconds(self) -> float:
        return self.graphs.capture_seconds if self.graphs is not None else 0.0

    def bucket(self, length: int) -> int | None:
        """The padded length of a prompt of `length` positions, or None: prefilled in its own shape."""
        if not self.pad or length > self.buckets[-1]:
            return None
        return next(b for b in self.buckets if b >= length)

    def run(self, start: int, prompts: list[torch.Tensor]) -> None:
        """Prompts (L_i, D) into rows start..start+n (see `ModelRunner.prefill`)."""
        if not self.pad:
            self.alone += len(prompts)
            self.runner.prefill(start, prompts)
            return
        for i, prompt in enumerate(prompts):
            bucket = self.bucket(prompt.shape[0])
            if bucket is None:
                self.alone += 1
                self.runner.prefill(start + i, [prompt])
            else:
                self.padded += 1
                self._padded(start + i, prompt, bucket)

    def _padded(self, row: int, prompt: torch.Tensor, bucket: int) -> None:
        runner, state = self.runner, self.runner.state
        if self.inputs is None:
            self.inputs = PrefillInputs(self.buckets[-1], state.hidden.shape[1], state.logits.shape[1],
                                        state.hidden.dtype, state.hidden.device)
        inputs = self.inputs
        runner.load_prefill(inputs, row, prompt, bucket)  # (the copy converts the dtype)
        if bucket not in self.by_bucket and self.graphs is not None:
            reads = [*inputs.tensors(), state.hidden, state.logits, state.lengths, *runner.cache.tensors()]
            self.by_bucket[bucket] = self.graphs.capture(lambda: runner.prefill_padded(inputs, bucket), reads,
                                                         inputs.logits)
        graph = self.by_bucket.get(bucket)
        if graph is None:
            runner.prefill_padded(inputs, bucket)
        else:
            graph.replay()
