"""omnitts: offline batch speech synthesis for the Qwen3-TTS-12Hz family.

    import omnitts
    tts = omnitts.load("path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    audio = tts.synthesize("Hello.", speaker="ryan", language="english")
    audio.save("hello.wav")      # audio.samples (float32), audio.sample_rate; plays inline in Jupyter
"""

import logging as _logging
import os as _os
from typing import TYPE_CHECKING as _TYPE_CHECKING

# Progress notes (e.g. the one-time kernel build) go to the "omnitts" logger: silent in a library
# unless the application configures logging; the CLI shows them on stderr.
_logging.getLogger("omnitts").addHandler(_logging.NullHandler())

# OMNITTS_CPU_PROFILE (device/features.py) runs torch's kernels of that CPU class too: torch reads
# ATEN_CPU_CAPABILITY once, at its first CPU operation, and importing the models makes one. The profile's
# first word is torch's level (avx2, avx512); an exported ATEN_CPU_CAPABILITY wins.
if _os.environ.get("OMNITTS_CPU_PROFILE", "").startswith("avx"):
    _os.environ.setdefault("ATEN_CPU_CAPABILITY", _os.environ["OMNITTS_CPU_PROFILE"].split("_")[0])

from .errors import AudioError, CheckpointError, OmniTTSError, RequestError, VoiceError
from .version import __version__

# The rest is imported on first use (PEP 562): they bring torch and transformers, ~2 s, which `omnitts --help`,
# `--version` and a command's argument errors do without; `from omnitts import TTS` works as ever.
_LAZY = {"TTS": "api", "load": "api", "read_results": "batch.ledger", "SamplingParams": "params",
         "Request": "request", "Voice": "request", "Audio": "result", "Result": "result"}

if _TYPE_CHECKING:  # for type checkers and editors, which do not run __getattr__
    from .api import TTS, load
    from .batch.ledger import read_results
    from .params import SamplingParams
    from .request import Request, Voice
    from .result import Audio, Result


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'omnitts' has no attribute {name!r}")
    from importlib import import_module

    value = globals()[name] = getattr(import_module(f".{_LAZY[name]}", __name__), name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["TTS", "Audio", "Result", "load", "Request", "Voice", "SamplingParams", "read_results",
           "OmniTTSError", "CheckpointError", "RequestError", "AudioError", "VoiceError", "__version__"]
