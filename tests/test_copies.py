"""Host<->device copies on the synth loop (issue 37, "blocking copies in the loop"), checked on the CPU.

Between two frames the host builds prompts, prefills and feeds the codec while the device runs the
frame launched last; a blocking copy anywhere there makes the host wait for that frame and throws the
overlap away. `CopyRecorder` (omnitts/testing/copies.py) records every copy Python code asks for, by
provenance (the CPU plays the device); these tests run a tiny synth loop under it and allow only the
device layer's copies: `copies.Uploader` (pinned, non_blocking) and the backend's `to_host`, whose
handles may be waited for in `Engine._collect` and, for audio, at the next step or when an item ends.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnitts import sampling
from omnitts.device import copies
from omnitts.device.base import Backend
from omnitts.engine.engine import Engine
from omnitts.engine.pipeline import Job, Pipeline
from omnitts.models.codec_streams import CodecStreams
from omnitts.request import Request
from omnitts.testing.copies import CopyRecorder, Marker, Transfer, Wait

TEXTS = ["Short one.", "A somewhat longer sentence for the batch.", "Third of the group."]


def _record_synth(tts, jobs, voice=None) -> tuple[list, CopyRecorder]:
    """Run `jobs` through a Pipeline under a CopyRecorder allowing the device layer's copies; every
    `Engine.step` that returns leaves a "step" marker. `voice`: a Voice made before (its tensors are
    on the host: `clone_voice` returns them there)."""
    step = Engine.step
    with CopyRecorder() as rec:
        if voice is not None:
            rec.mark_host(voice.x_vector, voice.ref_codes)
        rec.allow(copies.Uploader, "__call__", "upload", uploads=True)
        rec.allow(Backend, "to_host", "to_host", transfers=True)
        # sampling's constants: made once per process, on the first sampled frame (sampling.py's own finding).
        rec.allow(sampling, "_c", "sampling constant", uploads=True)

        def marked(self):
            finished = step(self)
            rec.mark("step")
            return finished

        Engine.step = marked
        try:
            outcomes = list(Pipeline(tts, lookahead=2).run(jobs))
        finally:
            Engine.step = step
    return outcomes, rec


def _jobs(tts, voice=None):
    speaker = None if voice is not None else "ryan"
    return [Job(Request(text, speaker=speaker, voice=voice), tts.default_params(greedy=i == 1, max_frames=frames,
                                                                               seed=i))
            for i, (text, frames) in enumerate(zip(TEXTS, [30, 41, 36]))]


@pytest.mark.parametrize("kind", ["custom_voice", "base"])
def test_the_synth_loop_copies_only_through_the_device_layer_and_reads_audio_a_step_later(tts_factory, ref_wav,
                                                                                         kind):
    tts = tts_factory(kind)
    voice = tts.clone_voice(ref_wav, "A reference clip.") if kind == "base" else None  # ICL: codes in the prompt
    outcomes, rec = _record_synth(tts, _jobs(tts, voice), voice)
    assert [o.ok for o in outcomes] == [True] * 3 and all(o.samples > 0 for o in outcomes)

    # No copy outside the device layer (prompt ids, prefill lengths, codec slots/frames/positions, audio).
    assert rec.unexpected() == [], "\n".join(map(str, rec.unexpected()))
    assert rec.calls.get("upload", 0) > 10  # prompts, prefills and codec calls went through the uploader

    # Waits: the engine's codes only in `_collect`; audio at the next step or when its item ends.
    made: dict[int, tuple[Transfer, int]] = {}  # handle -> (its Transfer, steps seen when it was made)
    steps = 0
    audio_waits = 0
    for event in rec.events:
        if isinstance(event, Marker):
            steps += 1
        elif isinstance(event, Transfer):
            made[event.handle] = (event, steps)
        elif isinstance(event, Wait):
            transfer, made_at = made[event.handle]
            if "engine.py" in transfer.where:
                assert "Engine._collect" in event.stack, f"codes waited for outside _collect at {event.where}"
                assert steps > made_at, f"codes waited for in the step that launched them at {event.where}"
            else:
                assert "codec_streams.py" in transfer.where, transfer
                audio_waits += 1
                assert steps > made_at or "Pipeline._last_audio" in event.stack, (
                    f"audio made at {transfer.where} waited for in the same step at {event.where}")
    assert audio_waits > 0 and steps > 30


def test_the_recorder_sees_blocking_and_unpinned_copies_and_nothing_else():
    device = torch.zeros(4)  # the CPU plays the device: made by an op, not from host data
    with CopyRecorder() as rec:
        torch.tensor([1, 2], device=device.device)  # made on the device from host data
        torch.tensor([3, 4]).to(device.device, non_blocking=True)  # non_blocking from pageable memory
        torch.from_numpy(np.arange(4.0)).to(device.device)  # a plain upload
        device[:2] = torch.tensor([5.0, 6.0])  # an upload by assignment
        device.cpu()  # a download
        device.sum().item()  # a sync
        bool(device.max() > 0)  # a sync
        pinned = rec.mark_pinned(torch.tensor([7, 8]))
        pinned.to(device.device, non_blocking=True)  # the right way: pinned, non_blocking
        fine = [device.to(device.device), device.to(torch.float64), (torch.tensor([1.0]) * 2).numpy(),
                torch.tensor([1]).tolist()]  # device to device, casts, host-only work
    apis = [(c.kind, c.api, c.blocking) for c in rec.copies]
    assert apis == [("upload", "torch.tensor(device=)", True), ("upload", "Tensor.to(device)", False),
                    ("upload", "Tensor.to(device)", True), ("upload", "Tensor.__setitem__", True),
                    ("download", "Tensor.cpu", True), ("download", "Tensor.item", True),
                    ("download", "Tensor.__bool__", True), ("upload", "Tensor.to(device)", False)], apis
    assert [c.error is not None for c in rec.copies] == [False, True] + [False] * 6
    assert all("test_copies.py" in c.where for c in rec.copies) and len(fine) == 4
    assert rec.unexpected() == rec.copies  # none was made through an allowed helper


class _Event:
    def __init__(self):
        self.done = False
        self.synchronized = False

    def record(self):
        pass

    def query(self):
        return self.done

    def synchronize(self):
        self.synchronized = self.done = True


class _Api:
    def __init__(self):
        self.events = []

    def Event(self):  # noqa: N802 - torch.cuda.Event's name
        self.events.append(_Event())
        return self.events[-1]


def test_uploads_to_an_accelerator_are_pinned_non_blocking_and_keep_their_staging_until_the_copy_ends(monkeypatch):
    api = _Api()
    with CopyRecorder() as rec:
        upload = copies.Uploader("cpu", api=api, pin=lambda t: rec.mark_pinned(t.clone()), accelerator=True)
        rec.allow(copies.Uploader, "__call__", "upload", uploads=True)
        first = upload(torch.tensor([1, 2, 3]))
        staging = upload.in_flight[0][0]
        second = upload(torch.tensor([4, 5]))  # the first copy has not ended: its staging stays referenced
        assert len(upload.in_flight) == 2 and upload.in_flight[0][0] is staging
        api.events[0].done = True
        upload(rec.mark_pinned(torch.tensor([6])))  # already pinned: copied as it is; the ended copy is released
    assert first.tolist() == [1, 2, 3] and second.tolist() == [4, 5]
    assert [s for s, _ in upload.in_flight] != [staging] and len(upload.in_flight) == 2
    assert [(c.kind, c.blocking, c.pinned, c.via) for c in rec.copies] == [("upload", False, True, "upload")] * 3
    assert rec.unexpected() == []

    monkeypatch.setattr(copies, "MAX_IN_FLIGHT", 2)  # events that never fire: the oldest is waited for
    for value in range(3):
        upload(torch.tensor([value]))
    assert len(upload.in_flight) <= 2 and api.events[2].synchronized

    cpu = copies.Uploader("cpu")
    host = torch.tensor([1.0])
    assert cpu(host) is host  # the CPU is the device: nothing to copy


def test_codec_streams_read_their_audio_only_when_asked_and_give_the_same_samples(tts_factory):
    ckpt = tts_factory("base").ckpt
    codes = torch.randint(0, 2048, (40, 16), generator=torch.Generator().manual_seed(3))
    ref = torch.randint(0, 2048, (12, 16), generator=torch.Generator().manual_seed(4))
    reads, leads = [], []

    class Later:
        def __init__(self, tensor):
            self.tensor = tensor.clone()

        def result(self):
            reads.append(self)
            return self.tensor.numpy()

    def run(streams, later):
        sid, pieces = streams.open(ref), []
        for i in range(0, len(codes), 9):
            streams.push(sid, codes[i:i + 9])
            if later:
                pending = streams.pump_later()
                assert not reads, "pump_later read a copy"
                pieces += [p.result() for p in pending.values()]
                reads.clear()
                lead = streams.streams[sid].lead  # the ICL lead sample: copied out once its call was read
                assert lead is None or (lead.copy is None and lead.value.shape == (1,))
                leads.append(lead is not None)
            else:
                pieces += list(streams.pump().values())
        end = streams.close(sid)
        return np.concatenate([end.head, *pieces, end.tail])

    now = run(CodecStreams(ckpt.codec, chunk_frames=8, max_streams=2), False)
    later = run(CodecStreams(ckpt.codec, chunk_frames=8, max_streams=2, to_host=Later), True)
    assert now.shape == later.shape and np.array_equal(now, later) and any(leads)


def test_an_audio_copy_that_fails_when_read_fails_its_items_and_the_run_goes_on(tts_factory, monkeypatch):
    """On a device a decode's error can surface only when its copy is read (a step later): that fails
    the items whose audio it held, as a decode that raises at once does, and nothing else."""
    tts = tts_factory("custom_voice")
    real, broken = Backend.to_host, []

    class Lost:
        def result(self):
            raise RuntimeError("the device lost the copy")

    def to_host(self, tensor):
        if tensor.dtype == torch.float32 and not broken:  # the first codec call's waveform (codes are int64)
            broken.append(tensor.shape[0])
            return Lost()
        return real(self, tensor)

    monkeypatch.setattr(Backend, "to_host", to_host)
    outcomes = list(Pipeline(tts).run(_jobs(tts)))
    failed = [o for o in outcomes if not o.ok]
    assert len(outcomes) == 3 and broken and 1 <= len(failed) <= broken[0]
    assert all(o.error == "RuntimeError while decoding: the device lost the copy" for o in failed)
    assert all(o.samples > 0 for o in outcomes if o.ok)
