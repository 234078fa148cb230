"""omnitts: offline batch speech synthesis for the Qwen3-TTS-12Hz family.

    import omnitts
    tts = omnitts.load("path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    audio = tts.synthesize("Hello.", speaker="ryan", language="english")
    audio.save("hello.wav")      # audio.samples (float32), audio.sample_rate; plays inline in Jupyter
"""

import logging as _logging
import os as _os

# Progress notes (e.g. the one-time kernel build) go to the "omnitts" logger: silent in a library
# unless the application configures logging; the CLI shows them on stderr.
_logging.getLogger("omnitts").addHandler(_logging.NullHandler())

# OMNITTS_CPU_PROFILE (device/features.py) runs torch's kernels of that CPU class too: torch reads
# ATEN_CPU_CAPABILITY once, at its first CPU operation, and importing the models makes one. The profile's
# first word is torch's level (avx2, avx512); an exported ATEN_CPU_CAPABILITY wins.
if _os.environ.get("OMNITTS_CPU_PROFILE", "").startswith("avx"):
    _os.environ.setdefault("ATEN_CPU_CAPABILITY", _os.environ["OMNITTS_CPU_PROFILE"].split("_")[0])

from .api import TTS, load
from .batch.ledger import read_results
from .errors import AudioError, CheckpointError, OmniTTSError, RequestError, VoiceError
from .params import SamplingParams
from .request import Request, Voice
from .result import Audio, Result
from .version import __version__

__all__ = ["TTS", "Audio", "Result", "load", "Request", "Voice", "SamplingParams", "read_results",
           "OmniTTSError", "CheckpointError", "RequestError", "AudioError", "VoiceError", "__version__"]
