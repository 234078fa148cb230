"""Micro-benchmark: per-frame sampling cost, before (host generators + two full sorts) and after.

One frame's sampling = codebook 0 over the talker vocabulary (3072, control codes suppressed) plus
15 sub-talker codebooks (2048 each): the `choose` calls and the noise they consume. "before" is a
verbatim copy of the previous implementation (each row's torch.Generator filling a noise buffer with
33792 exponentials per frame, then `warp` sorting the whole vocabulary twice, greedy rows included);
"after" is omnitts.sampling (counter-based noise, top-K candidates, no warping for all-greedy batches).

    python scripts/bench_sampling.py [--batches 1 8 64] [--reps 300] [--threads 2] [--top-p 1.0]

Prints milliseconds per frame (median and minimum over --reps frames, after a warm-up; before and
after alternate, so other load on the machine skews both alike) for each batch size,
sampled (the official defaults: top_k 50, top_p 1.0, temperature 0.9) and greedy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from omnitts import sampling
from omnitts.params import RowParams, SamplingParams

TALKER_VOCAB, PREDICTOR_VOCAB, GROUPS, EOS = 3072, 2048, 16, 2150


# -- the previous implementation, kept here as the baseline ----------------------------------------
def old_warp(logits, temperature, top_k, top_p):
    vocab = logits.shape[-1]
    logits = logits / temperature
    ordered, _ = torch.sort(logits, dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    kth = ordered.gather(-1, k - 1)
    logits = logits.masked_fill(logits < kth, float("-inf"))
    ascending, order = torch.sort(logits, dim=-1)
    cumulative = ascending.softmax(-1).cumsum(-1)
    remove = cumulative <= (1 - top_p)
    remove[..., -1:] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def old_choose(logits, do_sample, temperature, top_k, top_p, noise):
    greedy = logits.argmax(-1)
    probs = old_warp(logits, temperature, top_k, top_p).softmax(-1)
    return torch.where(do_sample, (probs / noise).argmax(-1), greedy)


def old_frame(talker, predictor, rows: RowParams, generators, noise):
    if generators:  # engine._stage_noise: one host call per sampling row
        size = noise.shape[1]
        for row, gen in enumerate(generators):
            noise[row] = torch.empty(size).exponential_(generator=gen)
    old_choose(talker, rows.do_sample, rows.temperature, rows.top_k, rows.top_p, noise[:, :TALKER_VOCAB])
    for g in range(1, GROUPS):
        chunk = noise[:, TALKER_VOCAB + (g - 1) * PREDICTOR_VOCAB: TALKER_VOCAB + g * PREDICTOR_VOCAB]
        old_choose(predictor[g - 1], rows.sub_do_sample, rows.sub_temperature, rows.sub_top_k, rows.sub_top_p, chunk)


# -- now -------------------------------------------------------------------------------------------
def new_frame(talker, predictor, rows: RowParams, frame, plan: sampling.FramePlan):
    keys = sampling.frame_keys(rows.seed, frame) if plan.samples else None
    sampling.choose(talker, rows.do_sample, rows.temperature, rows.top_k, rows.top_p, keys, 0, plan.talker)
    for g in range(1, GROUPS):
        sampling.choose(predictor[g - 1], rows.sub_do_sample, rows.sub_temperature, rows.sub_top_k,
                        rows.sub_top_p, keys, g, plan.predictor)


def timed(before, after, reps: int) -> tuple[list[float], list[float]]:
    """Milliseconds per call of each, alternating the two so that load from other processes hits both alike."""
    for _ in range(max(3, reps // 20)):
        before()
        after()
    times = ([], [])
    for _ in range(reps):
        for fn, out in ((before, times[0]), (after, times[1])):
            start = time.perf_counter()
            fn()
            out.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top-p", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    suppress = sampling.talker_mask(TALKER_VOCAB, EOS)
    print(f"ms per frame, median (min) of {args.reps}, {args.threads} threads, top_p {args.top_p}")
    print(f"{'batch':>5} {'mode':>7} {'before':>17} {'after':>15} {'speed-up':>8}")
    for batch in args.batches:
        talker = (3 * torch.randn(batch, TALKER_VOCAB, generator=gen)).masked_fill(suppress, float("-inf"))
        predictor = [3 * torch.randn(batch, PREDICTOR_VOCAB, generator=gen) for _ in range(GROUPS - 1)]
        frame = torch.zeros(batch, dtype=torch.long)
        for greedy in (False, True):
            params = [SamplingParams(top_p=args.top_p, subtalker_top_p=args.top_p, seed=i) for i in range(batch)]
            params = [p.greedy() for p in params] if greedy else params
            rows = RowParams.of(params)
            generators = [] if greedy else [torch.Generator().manual_seed(i) for i in range(batch)]
            noise = torch.ones(batch, TALKER_VOCAB + (GROUPS - 1) * PREDICTOR_VOCAB)
            plan = sampling.FramePlan.of(params, TALKER_VOCAB, PREDICTOR_VOCAB)
            with torch.inference_mode():
                before, after = timed(lambda: old_frame(talker, predictor, rows, generators, noise),
                                      lambda: new_frame(talker, predictor, rows, frame, plan), args.reps)
            b, a = statistics.median(before), statistics.median(after)
            mode = "greedy" if greedy else "sampled"
            print(f"{batch:>5} {mode:>7} {b:>8.3f} ({min(before):>6.3f}) {a:>7.3f} ({min(after):>5.3f}) {b / a:>7.1f}x",
                  flush=True)


if __name__ == "__main__":
    main()
