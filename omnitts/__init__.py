"""omnitts: offline batch speech synthesis for the Qwen3-TTS-12Hz family.

    import omnitts
    tts = omnitts.load("path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    tts.synthesize("Hello.", speaker="ryan", language="english").save("hello.wav")
"""

from .api import TTS, Result, load
from .errors import AudioError, CheckpointError, OmniTTSError, RequestError, VoiceError
from .params import SamplingParams
from .request import Request, Voice

__all__ = ["TTS", "Result", "load", "Request", "Voice", "SamplingParams",
           "OmniTTSError", "CheckpointError", "RequestError", "AudioError", "VoiceError"]
__version__ = "0.1.0"
