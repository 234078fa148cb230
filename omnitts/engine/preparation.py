"""A job made ready to run (`prepare`): its `JobState`, with a prompt per piece, or the outcome that fails it.

What one job may cost is settled here, before it runs: its text is split (at most `split.MAX_PIECES`
pieces, whose prompts are held until the job ends), an explicit frame budget is shared by its pieces
(`JobState.budget_shares`), and every piece must fit an engine on its own (`check_fits_alone`). An
exception while preparing fails that item only; the pipeline (`Pipeline._fill`) decides when a job is
prepared.
"""

from __future__ import annotations

import random
import time
import warnings
from dataclasses import replace
from typing import Callable

from ..errors import OmniTTSError, RequestError
from ..text.split import pieces_problem
from .engine import plan
from .jobs import Job, JobState, Outcome, one_line, since
from .join import StreamJoiner


def prepare(job: Job, tts, split: Callable[[str, str], list[str]], sink: Callable[[Job], object] | None,
            retry_runaway: int) -> tuple[JobState | None, Outcome | None]:
    """(the item of `job`, None), or (None, the outcome that fails it): its seed drawn if it samples without
    one, its text split by `split` and each piece made a prompt by `tts`, its sink made by `sink` (if any)."""
    started = time.perf_counter()
    params = job.params
    seed = params.seed
    if seed is None and params.samples:
        seed = random.SystemRandom().randrange(2**31)  # recorded, so every result can be reproduced
    if job.fail is not None:
        return None, Outcome(job, error=job.fail, seed=seed, timings={"total": since(started)})
    item = JobState(job, replace(params, seed=seed), seed, started=started)
    request = job.request
    try:
        if job.prompt is not None:
            item.pieces.append((request, job.prompt))
        else:
            texts = split(request.text, request.language) or [request.text]  # empty: TTS.prepare says why
            problem = pieces_problem(request.text, len(texts))
            if problem:
                raise RequestError(problem)
            if len(texts) > 1 and request.ref_audio is not None and request.voice is None:
                voice = tts.clone_voice(request.ref_audio, request.ref_text, request.x_vector_only)
                request = replace(request, voice=voice)  # encode the reference once for all pieces
            for text in texts:
                piece = request if len(texts) == 1 else replace(request, text=text)
                item.pieces.append((piece, tts.prepare(piece)))
        item.shares = item.budget_shares()
        if warning := item.budget_warning():
            warnings.warn(warning, stacklevel=2)
        for index in range(len(item.pieces)):
            check_fits_alone(tts, item, index)
    except Exception as exc:  # noqa: BLE001 - one item's input, however broken, fails only that item
        error = (str(exc) if isinstance(exc, OmniTTSError)
                 else f"{type(exc).__name__} while preparing: {one_line(exc)}")
        return None, Outcome(job, error=error, exception=exc, seed=seed, timings={"total": since(started)})
    if sink is not None:
        try:  # a sink may refuse an item (a file name the filesystem cannot hold): that item fails
            item.sink = sink(job)
        except OmniTTSError as exc:
            return None, Outcome(job, error=str(exc), exception=exc, seed=seed, timings={"total": since(started)})
    item.prepare_s = since(started)
    item.joiner = StreamJoiner(len(item.pieces), tts.sample_rate, item.emit)
    auto_budget = params.max_frames is None and job.request.max_seconds is None
    item.incremental = not (retry_runaway and auto_budget and params.samples)
    return item, None


def check_fits_alone(tts, item: JobState, index: int) -> None:
    """Raise RequestError if this piece would not fit an engine even on its own (cache and prefill
    budgets, the talker's positions)."""
    prompt, params = item.pieces[index][1], item.piece_params(index)
    plan(tts.ckpt, prompt.embeds.shape[0] + params.max_frames + 1, 1, prompt.trailing.shape[0],
         tts.kv_budget_bytes, tts.ckpt.device.type, tts.eager, tts.graph_buckets, tts.span_buckets,
         tts.max_prefill_tokens, prompt_positions=prompt.embeds.shape[0], longest_part=prompt.longest_part)
