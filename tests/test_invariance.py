"""Batch invariance as a property (docs/architecture.md, determinism; issue 35): a request's per-step
hidden states and logits, talker and code predictor, prefill and decode, and its sampled codes are
bitwise the same alone (an engine of max_batch 1) and in batches of 2, 6 and 8 with requests of other
lengths joining and leaving, in float32 and bfloat16, on omnitts' native kernels and on the fallback
(oneDNN and torch). Codes alone are too weak a signal: a rounding difference shows in the hidden
states long before, and often without, a changed code.

The default tier runs the issue's shapes (talker head_dim 32, 2 KV heads for 4 query heads; predictor
hidden 48, head_dim 16) once per dtype and path on one thread, and the fallback attention kernel on
two; the slow tier a grid of head dims, GQA groups and hidden sizes that are and are not multiples of
the kernels' 16-wide tiles, on two threads (on a busy two-core machine, several times slower).
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

import omnitts
from omnitts.device import native
from omnitts.engine import Engine, EngineConfig
from omnitts.request import Request
from omnitts.testing import checkpoint as testing_checkpoint

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)

LINES = [("Hi.", {"speaker": "ryan", "language": "english"}),
         ("你好，今天怎么样？", {"speaker": "vivian", "language": "chinese"}),
         ("Bonjour tout le monde, comment ça va?", {"speaker": "serena", "language": "french"}),
         ("Auto language, a sentence of middling length.", {"speaker": "aiden", "language": "auto"}),
         ("Two words", {"speaker": "ryan", "language": "auto", "instruct": "Speak angrily."}),
         ("A long instructed line that keeps going for a while to make the prompt the longest of all.",
          {"speaker": "dylan", "instruct": "Whisper softly, slowly, as if telling a secret."}),
         ("Short again.", {"speaker": "eric", "language": "chinese"}),
         ("Eight.", {"speaker": "vivian", "language": "english"}),
         ("Nine joins late.", {"speaker": "serena"}),
         ("Ten joins last and leaves early.", {"speaker": "aiden", "language": "english"})]
FRAMES = [7, 11, 5, 9, 12, 6, 10, 8, 6, 4]  # budgets: rows leave at different steps


def _preset(hidden, heads, kv_heads, head_dim, predictor=(48, 4, 2, 16)):
    tiny = testing_checkpoint.PRESETS["tiny-0.6b"]
    p_hidden, p_heads, p_kv, p_head_dim = predictor
    return {"size": "1b7", "talker": (hidden, 2 * hidden, 2, heads, kv_heads, head_dim),
                "predictor": (p_hidden, 2 * p_hidden, 2, p_heads, p_kv, p_head_dim), "text_hidden": 32,
                "codec": tiny["codec"], "mimi": tiny["mimi"]}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(hidden, heads, kv_heads, head_dim, predictor) -> a CustomVoice checkpoint of those shapes."""
    built = {}

    def get(*shape, **kwargs):
        key = (shape, tuple(sorted(kwargs.items())))
        if key not in built:
            name = "invariance-" + "-".join(map(str, shape + tuple(sum(kwargs.values(), ()))))
            with pytest.MonkeyPatch.context() as patch:
                patch.setitem(testing_checkpoint.PRESETS, name, _preset(*shape, **kwargs))
                built[key] = testing_checkpoint.build_checkpoint(tmp_path_factory.mktemp(name), preset=name)
        return built[key]

    return get


def _load(path, dtype: str, use_native: bool, max_batch: int):
    if use_native and not native.available(getattr(torch, dtype)):
        pytest.skip(f"omnitts' native {dtype} kernels do not build here")
    with pytest.MonkeyPatch.context() as patch:
        if not use_native:
            patch.setattr(native, "available", lambda dtype: False)  # oneDNN and torch, as OMNITTS_NATIVE=0
        return omnitts.load(path, dtype=dtype, max_batch=max_batch)


class Recorder:
    """Every per-row output of one engine run, keyed by (request tag, what): the talker's final hidden
    states (a prefill's over the row's own positions) and codebook-0 logits, the code predictor's final
    hidden states and logits at each of its steps, each frame's codes (sampling included) and, after
    the run, the codes the request returns (`output`)."""

    def __init__(self, engine: Engine):
        self.records = defaultdict(list)
        self.rows: list = []  # (tag, prompt length) of the rows the model is computing now
        self.prefilling, self.prompt = False, 0
        runner, talker = engine.runner, engine.runner.talker
        running = engine.scheduler.running
        prefill, frame = runner.prefill, runner.frame

        def run_prefill(start, prompts):
            self.rows = [(s.tag, s.prompt.embeds.shape[0]) for s in running[start:start + len(prompts)]]
            self.prefilling, self.prompt = True, -1
            prefill(start, prompts)
            self.prefilling = False

        def run_frame(batch, span, plan):
            self.rows = [(s.tag, None) for s in running[:batch]]
            frame(batch, span, plan)
            for row, (tag, _) in enumerate(self.rows):
                self.records[tag, "codes"].append(engine.state.codes[row].clone())

        runner.prefill, runner.frame = run_prefill, run_frame
        modules = {"talker": talker.model, "codec_head": talker.codec_head,
                   "predictor": talker.code_predictor.model}
        modules.update({f"lm_head{g}": head for g, head in enumerate(talker.code_predictor.lm_head, 1)})
        self.hooks = [m.register_forward_hook(self._hook(name)) for name, m in modules.items()]
        self.hooks.append(talker.model.register_forward_pre_hook(self._next_prompt))

    def _next_prompt(self, module, args):
        if self.prefilling:
            self.prompt += 1

    def _hook(self, name):
        def record(module, args, out):
            rows = list(enumerate(self.rows))
            if self.prefilling and out.shape[0] < len(rows):  # a prefill one prompt at a time
                rows = [(0, self.rows[self.prompt])]
            for row, (tag, length) in rows:
                value = out[row]
                if self.prefilling and value.dim() == 2:  # (positions, D): the row's own, not the padding
                    value = value[:length]
                self.records[tag, name].append(value.detach().clone())
        return record

    def close(self):
        for hook in self.hooks:
            hook.remove()


def _run(tts, jobs, max_num_seqs: int) -> dict:
    """jobs: [(tag, Request, SamplingParams)] all queued at once -> the Recorder's records."""
    engine = Engine(tts.ckpt, EngineConfig(max_num_seqs=max_num_seqs, max_positions=256))
    recorder = Recorder(engine)
    try:
        for tag, request, params in jobs:
            engine.add(tts.prompts.build(request, None), params, tag=tag)
        done = list(engine.run())
    finally:
        recorder.close()
    assert len(done) == len(jobs)
    for seq in done:  # what the request returns; the frames before it were all recorded
        frames = torch.from_numpy(seq.codes())
        assert len(recorder.records[seq.tag, "codes"]) >= len(frames)
        recorder.records[seq.tag, "output"].append(frames)
    return recorder.records


def _differences(alone: dict, batched: dict, tag) -> list[str]:
    """Where request `tag`'s records differ: 'what[step]: max difference' (the first step only), or their
    step counts by more than the discarded frame after the last."""
    found = []
    for (t, what), steps in sorted(alone.items(), key=lambda item: str(item[0])):
        if t != tag:
            continue
        other = batched[tag, what]
        for step, (a, b) in enumerate(zip(steps, other)):
            if not torch.equal(a, b):
                found.append(f"{what}[{step}]: {(a.double() - b.double()).abs().max().item():.3g}")
                break
        else:
            # Step counts may differ by the discarded frame after the last (run only while batch mates
            # have budget left); `output` and `_run`'s check cover every frame that counts.
            per_frame = 15 if what == "predictor" else 1  # the predictor's forwards per frame (codebooks 1..15)
            if abs(len(other) - len(steps)) > per_frame:
                found.append(f"{what}: {len(steps)} steps alone, {len(other)} batched")
    return found


def check_invariance(path, dtype: str, use_native: bool, batches=(2, 6, 8), threads: int = 1) -> None:
    torch.set_num_threads(threads)  # conftest puts one thread back
    single = _load(path, dtype, use_native, max_batch=1)
    wide = _load(path, dtype, use_native, max_batch=max(batches))
    for greedy in (True, False):
        jobs = [(i, Request(text, **extra), single.default_params(greedy, max_frames=FRAMES[i], seed=100 + i))
                for i, (text, extra) in enumerate(LINES)]
        alone = {}
        for job in jobs:
            alone.update(_run(single, [job], 1))
        assert all(len(alone[i, "talker"]) > FRAMES[i] for i in range(len(jobs)))  # prefill + every frame
        for batch in batches:
            # More requests than slots: rows join as others leave, and the batch holds rows of other lengths.
            batched = _run(wide, jobs, batch)
            problems = {i: _differences(alone, batched, i) for i in range(len(jobs))}
            problems = {i: p for i, p in problems.items() if p}
            assert not problems, (f"{dtype}, {'native' if use_native else 'fallback'}, "
                                  f"{'greedy' if greedy else 'seeded'}, batch {batch}: {problems}")


@pytest.mark.parametrize("use_native", [True, False], ids=["native", "fallback"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_row_is_bitwise_the_same_alone_and_in_any_batch(build, dtype, use_native):
    """Issue 35's shapes: talker hidden 64, 4 heads / 2 KV heads of 32; predictor hidden 48, head_dim 16."""
    check_invariance(build(64, 4, 2, 32, predictor=(48, 4, 2, 16)), dtype, use_native)


GRID = [  # (talker hidden, heads, KV heads, head_dim), (predictor hidden, heads, KV heads, head_dim)
    ((64, 4, 4, 16), (48, 4, 4, 16)),  # no grouping
    ((72, 4, 2, 24), (40, 2, 1, 24)),  # hidden sizes off the 16-wide tiles, groups 2
    ((96, 8, 2, 32), (80, 8, 2, 16)),  # groups 4
    ((128, 8, 1, 64), (64, 4, 1, 32)),  # groups 8 and 4
    ((100, 4, 1, 128), (48, 2, 2, 128)),  # head_dim 128
]


@pytest.mark.slow
@pytest.mark.parametrize("use_native", [True, False], ids=["native", "fallback"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("talker, predictor", GRID, ids=[f"hd{t[3]}-g{t[1] // t[2]}-h{t[0]}" for t, _ in GRID])
def test_invariance_over_shapes(build, dtype, use_native, talker, predictor):
    check_invariance(build(*talker, predictor=predictor), dtype, use_native, threads=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fallback_decode_attention_is_row_invariant_and_matches_sdpa(dtype):
    """`cpu_attention`'s one-query calls: each row bitwise the same alone as next to rows of other
    lengths (the batch spanning more keys), masked or not, on two threads; sdpa's result within rounding."""
    from omnitts.device.cpu_weights import cpu_attention
    from omnitts.models.layers import float32_attention

    torch.set_num_threads(2)
    for heads, kv_heads, head_dim in ((4, 2, 16), (4, 1, 24), (8, 8, 32), (16, 2, 128)):
        for length in (1, 8, 17, 64, 65, 130):
            q = torch.randn(1, heads, 1, head_dim).to(dtype)
            k, v = (torch.randn(1, kv_heads, length, head_dim).to(dtype) for _ in range(2))
            alone = cpu_attention(q, k, v, None, False)
            torch.testing.assert_close(alone.float(), float32_attention(q, k, v, None, False).float(),
                                       rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-5)
            for batch, keys in ((2, length + 3), (6, length + 70), (8, 2 * length + 1)):
                qb = torch.randn(batch, heads, 1, head_dim).to(dtype)
                kb, vb = (torch.randn(batch, kv_heads, keys, head_dim).to(dtype) for _ in range(2))
                row = batch // 2
                qb[row], kb[row, :, :length], vb[row, :, :length] = q[0], k[0], v[0]
                lengths = torch.randint(1, keys + 1, (batch,))
                lengths[row] = length
                mask = (torch.arange(keys)[None] < lengths[:, None])[:, None, None]
                got = cpu_attention(qb, kb, vb, mask, False)
                assert torch.equal(got[row], alone[0]), (heads, kv_heads, head_dim, length, batch)
                same = cpu_attention(qb[:, :, :, :], kb[:, :, :length], vb[:, :, :length], None, False)
                assert torch.equal(same[row], alone[0]), (heads, kv_heads, head_dim, length, batch, "no mask")
