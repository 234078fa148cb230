"""What the Python API is given, checked before anything runs: requests, `generate`'s jobs, `stream`'s items
(a Request, a manifest-style dict, or either with its own SamplingParams), the deterministic option; and an
error named by the argument at fault (`requests[2]: ...`). `TTS` (tts.py) and `load` (api.py) call these; they
know nothing of the checkpoint beyond what `TTS.default_params` gives.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Union

import numpy as np

from .engine.jobs import Job
from .errors import OmniTTSError, RequestError, type_label
from .params import SamplingParams
from .request import Request, Voice
from .sampling import seed_word


# What `TTS.stream` accepts per item: a Request, a manifest-style dict, or either with its own parameters.
StreamItem = Union[Request, dict, tuple[Union[Request, dict], SamplingParams]]


def requests_iterator(name: str, value) -> Iterator:
    """An iterator over `value`, the requests of `stream` or `generate`: one request given alone (a dict, a
    Request; a string) would be iterated over its keys or characters, and None said only "'NoneType' object is
    not iterable"; TypeError naming the argument."""
    if hasattr(value, "columns") and hasattr(value, "to_dict"):  # a DataFrame iterates over its column names
        raise TypeError(f"{name}: a {type_label(type(value))} iterates over its column names; give its rows: "
                        "df.to_dict('records')")
    if isinstance(value, (str, bytes, dict, Request)):
        one = "[request]" if name == "requests" else "[(request, params)]"
        raise TypeError(f"{name}: expected an iterable of requests (a list, a generator), got one "
                        f"{type_label(type(value))}; give one request in a list: {one}")
    try:
        return iter(value)
    except TypeError:
        raise TypeError(f"{name}: expected an iterable of requests (a list, a generator), got "
                        f"{type_label(type(value))}") from None


def empty_cell(value) -> bool:
    """A DataFrame's empty cell: NaN (a float or object column's), or pandas' NA or NaT (a nullable column's,
    `df.convert_dtypes()`; pandas 2's `to_dict` gives them as they are), told by type, without importing pandas."""
    if isinstance(value, float) and math.isnan(value):
        return True
    kind = type(value)
    return kind.__name__ in ("NAType", "NaTType") and kind.__module__.startswith("pandas")


def python_int(value):
    """A checked integer (numpy's too) as a Python int, whose arithmetic never wraps; None stays None."""
    return None if value is None else int(value)


def check_request(request: Request) -> None:
    """Check a request's fields as a manifest line's are checked (type, range, text; `batch.manifest`), and
    that it names one reference, before anything uses them: RequestError naming the field."""
    from .batch.manifest import check_fields

    if request.text is None:  # required: `check_fields` takes None for absent, as in a manifest's optional fields
        raise RequestError("text: missing; give the words to speak")
    check_fields({name: getattr(request, name) for name in ("id", "text", "language", "speaker", "instruct",
                                                            "ref_text", "x_vector_only", "non_streaming",
                                                            "max_seconds")})
    if request.ref_audio is not None:
        check_reference(request.ref_audio)
    if request.voice is not None and not isinstance(request.voice, (Voice, str, os.PathLike)):
        raise RequestError(f"voice: expected a Voice or the path of a voice file, got {type(request.voice).__name__}")
    if request.ref_audio is not None and request.voice is not None:  # one of them would be ignored
        raise RequestError("voice: give either ref_audio or voice, not both")


def check_job(request, params) -> None:
    """A request and its parameters as `run` and `generate` take them: of those types, the request's fields
    checked as `stream` checks a `Request` (`check_request`). RequestError naming the argument or field."""
    if not isinstance(request, Request):
        raise RequestError(f"request: expected a Request, got {type(request).__name__}")
    if not isinstance(params, SamplingParams):
        raise RequestError(f"params: expected SamplingParams (see TTS.default_params), got {type(params).__name__}")
    check_request(request)


def numbered_job(i: int, job) -> Job:
    """`generate`'s job `i`, a (Request, SamplingParams) pair, checked (`check_job`): errors name `jobs[i]`."""
    if not isinstance(job, (tuple, list)) or len(job) != 2:
        raise RequestError(f"jobs[{i}]: expected a (Request, SamplingParams) pair, got {type(job).__name__}")
    try:
        check_job(*job)
    except RequestError as exc:
        raise RequestError(f"jobs[{i}]: {exc}") from None
    return Job(*job, key=i)


def check_reference(ref_audio) -> None:
    """Reference audio is a path or a (samples, sample_rate) pair (`io.audio.load_reference` checks the pair)."""
    if not isinstance(ref_audio, (str, os.PathLike, tuple)):
        raise RequestError(f"ref_audio: expected a path or a (samples, sample_rate) pair, got "
                           f"{type(ref_audio).__name__}")


def naming(exc: BaseException, where: str, field: str | None = None) -> BaseException:
    """`exc` with `where` before its message: of its own type, chained to it (as `raise ... from exc`); `exc`
    itself with `where` as a note where its type is not made from a message alone. `field`: a field that
    `where` names already, dropped from the message's start (`text[3]: ...`, not `text[3]: text: ...`)."""
    message = str(exc)
    if field is not None:
        message = message.removeprefix(f"{field}: ")
    try:
        named = type(exc)(f"{where}: {message}")
    except Exception:  # noqa: BLE001 - a constructor that takes other arguments (UnicodeDecodeError takes five)
        if hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(where)
        return exc
    named.__cause__ = exc
    return named


def check_deterministic(deterministic: bool, graph_buckets) -> None:
    """Deterministic mode runs every frame at the full batch (`EngineConfig.full_batch`): batch sizes given
    as well contradict it."""
    if deterministic and graph_buckets is not None:
        raise OmniTTSError("deterministic: every frame runs at the full batch, so graph_buckets do not apply; "
                           "leave them out")


def stream_item(tts, i: int, item, greedy, max_frames, seed, sampling) -> tuple[Request, SamplingParams]:
    """One `TTS.stream` item -> (Request with an id, SamplingParams); `tts` gives the default parameters."""
    from .batch.manifest import _typed_values, parse_item

    params = None
    if isinstance(item, tuple):
        if len(item) != 2 or not isinstance(item[1], SamplingParams):
            raise RequestError(f"requests[{i}]: a pair must be (Request or dict, SamplingParams)")
        item, params = item
    item_seed = None if seed is None else seed_word(seed + i)  # past 2**63 - 1: wrapped
    if isinstance(item, dict):
        # Read as a manifest line is: numpy's numbers (a seed from np.arange) as Python's, as the keyword
        # arguments take them; NaN or pandas' NA, a DataFrame row's empty cell (df.to_dict("records")), absent, as
        # the null of a table manifest made from that DataFrame; an integer id its digits, a whole float an
        # integer. Only a missing id is the position (the id 0 was taken for none)
        item = {k: v.item() if isinstance(v, (np.integer, np.floating)) else v for k, v in item.items()}
        item = _typed_values({k: v for k, v in item.items() if not empty_cell(v)})
        if item.get("id") is None or (isinstance(item["id"], str) and not item["id"]):  # (an array's == is one)
            item = {**item, "id": str(i)}
        for name in ("ref_audio", "voice"):  # a manifest line names files; objects go in a Request
            if item.get(name) is not None and not isinstance(item[name], (str, os.PathLike)):
                raise RequestError(f"requests[{i}]: {name}: a dict takes a file's path, as a manifest line "
                                   f"does, got {type(item[name]).__name__}; give a Request(..., {name}=...) "
                                   "for samples or a Voice")
            if isinstance(item.get(name), os.PathLike):  # a Path is a path: the manifest check takes a string
                item = {**item, name: os.fspath(item[name])}
        try:
            parsed = parse_item(item, i + 1, Path.cwd())
        except RequestError as exc:
            raise RequestError(f"requests[{i}]: {exc}") from None
        given = ["seed"] * (parsed.seed is not None) + list(parsed.sampling)
        if params is not None and given:  # the pair's parameters are used as given: this field would be dropped
            raise RequestError(f"requests[{i}]: {given[0]}: the pair's SamplingParams decide how it samples; set "
                               f"{given[0]} there, or give the dict alone")
        request, item_seed = parsed.request, parsed.seed if parsed.seed is not None else item_seed
        sampling = {**sampling, **parsed.sampling}
        if parsed.voice_path is not None:
            request = replace(request, voice=parsed.voice_path)
    elif isinstance(item, Request):
        try:
            check_request(item)
        except RequestError as exc:
            raise RequestError(f"requests[{i}]: {exc}") from None
        request = item if item.id else replace(item, id=str(i))  # "" is no id, as a dict's
    else:
        raise RequestError(f"requests[{i}]: expected a Request, a dict or a (request, SamplingParams) pair, "
                           f"got {type(item).__name__}")
    if params is None:  # an item's own max_seconds beats the run-wide max_frames (as in `omnitts synth`)
        budget = None if request.max_seconds is not None else max_frames
        params = tts.default_params(greedy, max_frames=budget, seed=item_seed, **sampling)
    return request, params
