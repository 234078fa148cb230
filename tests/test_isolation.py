"""One item's fault fails that item only: the rest of the run goes on (issue: no single line breaks a batch)."""

from __future__ import annotations

from omnitts.engine.pipeline import Job, Pipeline
from omnitts.request import Request


def test_an_unexpected_exception_while_preparing_fails_only_that_item(tts_factory, monkeypatch):
    tts = tts_factory("custom_voice", max_batch=2)
    prepare = type(tts).prepare

    def flaky(self, request):
        if request.text == "Breaks.":
            raise IndexError("index 4096 is out of bounds for dimension 0 with size 2048")
        return prepare(self, request)

    monkeypatch.setattr(type(tts), "prepare", flaky)
    jobs = [Job(Request(text, speaker="ryan", id=name), tts.default_params(greedy=True, max_frames=3))
            for name, text in (("a", "First."), ("b", "Breaks."), ("c", "Third."))]
    outcomes = {o.job.request.id: o for o in Pipeline(tts).run(jobs)}
    assert outcomes["a"].ok and outcomes["c"].ok and outcomes["a"].result.frames == 3
    assert not outcomes["b"].ok
    error = "IndexError while preparing: index 4096 is out of bounds for dimension 0 with size 2048"
    assert outcomes["b"].error == error
    assert isinstance(outcomes["b"].exception, IndexError)
