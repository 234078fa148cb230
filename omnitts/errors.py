"""Errors omnitts raises at its edges (checkpoints, requests, manifests).

Each carries a message meant for a person: it names the file, line or field at fault and, where it
can, says how to fix it. The CLI prints the message alone (no traceback) and exits non-zero.
"""

import builtins
import difflib


def type_label(kind: type) -> str:
    """How type `kind` is named as the "got" of "expected X, got Y": its name, with its module where another
    type shares the name with a builtin (numpy 2's bool is `numpy.bool`: "expected a bool, got bool" said nothing)."""
    name = kind.__name__
    if kind.__module__ != "builtins" and hasattr(builtins, name):
        return f"{kind.__module__}.{name}"
    return name


def did_you_mean(name: str, valid) -> str:
    """' (did you mean 'speaker'?)' when `name` is close to one of `valid` (a typo), else ''."""
    close = difflib.get_close_matches(str(name), list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class OmniTTSError(Exception):
    """Base class of every error omnitts raises on purpose."""


class CheckpointError(OmniTTSError):
    """A checkpoint directory is missing a file, a tensor or a field, or has one of the wrong shape."""


class RequestError(OmniTTSError):
    """A synthesis request asks for something this checkpoint cannot do (speaker, language, mode)."""


class AudioError(OmniTTSError):
    """Reference audio is missing, unreadable, silent or too short."""


class VoiceError(OmniTTSError):
    """A saved voice file is unreadable, malformed, or belongs to another checkpoint."""


class DeviceFailed(OmniTTSError):
    """The device stopped working during a run (a sticky CUDA or NPU error, or engine after engine failing):
    the run ends, and the items it was running are left unrecorded for a re-run, not recorded as failed."""
