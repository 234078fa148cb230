"""omnitts: offline batch speech synthesis for the Qwen3-TTS-12Hz family.

    import omnitts
    tts = omnitts.load("path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    audio = tts.synthesize("Hello.", speaker="ryan", language="english")
    audio.save("hello.wav")      # audio.samples (float32), audio.sample_rate; plays inline in Jupyter
"""

from .api import TTS, load
from .batch.ledger import read_results
from .errors import AudioError, CheckpointError, OmniTTSError, RequestError, VoiceError
from .params import SamplingParams
from .request import Request, Voice
from .result import Audio, Result
from .version import __version__

__all__ = ["TTS", "Audio", "Result", "load", "Request", "Voice", "SamplingParams", "read_results",
           "OmniTTSError", "CheckpointError", "RequestError", "AudioError", "VoiceError", "__version__"]
