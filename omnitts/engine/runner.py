"""The model side of the engine: batched prefill, and one whole frame for a batch of slots.

`frame` is the hot path: choose codebook 0 from the pending logits, run the code predictor's 15
steps, embed the frame, add each row's next trailing-text embedding and run one talker step to get
the next logits. It reads and writes only preallocated state (the slot prefix 0..batch-1), takes
its randomness from counter-based noise (a hash of each row's seed and frame index, see
omnitts.sampling) and makes no host sync, so a device backend can capture it whole as one graph per
batch size and sampling plan (`sampling.FramePlan`: the warping the batch needs, known on the host).
Prefill has variable shapes and always runs eagerly.
"""

from __future__ import annotations

import torch

from .. import sampling
from ..device.copies import upload
from ..models.layers import FrameKVCache, StaticKVCache
from .reference import predict_residuals
from .state import SlotCache, SlotState


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
                             keys, 0, plan.talker, talker.gumbel_scores)
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
