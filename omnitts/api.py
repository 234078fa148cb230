"""The Python API: load a checkpoint, clone voices, synthesize.

    import omnitts
    tts = omnitts.load("Qwen3-TTS-12Hz-0.6B-CustomVoice")
    audio = tts.synthesize("Hello there.", speaker="ryan", language="english")
    audio.save("hello.wav")          # or show `audio` in Jupyter to play it
    for audio in tts.stream([{"id": "a", "text": "One.", "speaker": "ryan"}, ...]):
        ...                          # each `Audio` as soon as it is finished

`load` (here) checks the engine options, loads the checkpoint and returns a `TTS` (tts.py: synthesize, stream,
clone_voice, load_voice, info); what they are given is checked in arguments.py. The library never prints.
"""

from __future__ import annotations

import os

import torch

from .arguments import StreamItem, check_deterministic
from .checkpoint import Checkpoint, load_checkpoint
from .device import make_deterministic, out_of_memory
from .engine import EngineConfig
from .errors import AudioError, OmniTTSError, RequestError, VoiceError
from .params import SamplingParams
from .recipe import VISIBLE, device_index, folded, option_problem, type_name
from .request import Request, Voice
from .result import Audio, Result
from .text.prompt import Prompt
from .tts import KV_BUDGET_BYTES, TTS

# What `from omnitts.api import ...` gives: `TTS` and `load`, and the types and errors their callers use.
__all__ = ["TTS", "load", "KV_BUDGET_BYTES", "StreamItem", "Audio", "Result", "Request", "Voice", "SamplingParams",
           "Prompt", "Checkpoint", "OmniTTSError", "RequestError", "AudioError", "VoiceError"]


def load(path, device: str = "cpu", dtype: str = "auto", official_tokenizer: bool = False,
         max_batch: int = 8, eager: bool = False, graph_buckets: list[int] | None = None,
         codec_chunk_frames: int = 25, span_buckets: list[int] | None = None,
         max_prefill_tokens: int | None = EngineConfig.max_prefill_tokens, codec_dtype: str = "float32",
         deterministic: bool = False) -> TTS:
    """Load a Qwen3-TTS-12Hz checkpoint directory (CustomVoice, VoiceDesign or Base; 0.6B or 1.7B).

    Args:
        path: the checkpoint directory, exactly as published (a str or path; `~` is the home folder).
        device: cpu, cuda or npu, or a torch.device of them (npu imports torch_npu; set allocator variables
            before calling); cuda and npu run on the process's current device (`torch.cuda.set_device`).
        dtype: auto (default: bfloat16 on cuda, on A2-class NPUs (float16 on older ones) and on CPUs
            with native bf16, AVX512-BF16 or AMX; float32 elsewhere), float32, bfloat16 or float16 for
            the language models, by name (in any case, as the flags read them) or as the torch dtype
            (torch.bfloat16). Parity with the official package is judged in float32.
        official_tokenizer: reproduce the official package's token ids (see tokenizer.py).
        max_batch: how many requests decode together at most.
        eager: no graph capture on cuda/npu (also OMNITTS_EAGER=1).
        graph_buckets: batch sizes that get a captured graph (None: 1, 2, 4, ... up to max_batch).
        span_buckets: attention spans that get a graph per batch size (None: 256, 512, ...; the
            engine's max_positions always does): a frame attends over the smallest that fits.
        max_prefill_tokens: prompt positions admitted per engine step at most (None: no limit).
        codec_chunk_frames: frames per streamed codec decode call (audio is decoded while
            generation continues, batched across requests).
        codec_dtype: float32 (default) or bfloat16 for the codec decoder (a name or the torch dtype). bfloat16 is what the
            official package does in bfloat16; it costs audio quality (about 20 dB SNR against
            float32) and on the CPU is no faster than the float32 codec of a bfloat16 run
            (docs/performance.md).
        deterministic: a line's codes and samples do not depend on the lines decoded beside it (their
            number, lengths, order), so shards, workers, retries and re-runs with the same settings give the
            same audio; costs some speed (docs/determinism.md). On the cpu the codes never depend on them,
            and this makes the samples bitwise too (the codec decodes one stream per call); npu: OmniTTSError.

    Returns:
        A `TTS` ready to `synthesize`, `stream` and describe itself with `info`.

    Raises:
        CheckpointError: a file is missing or does not match (the message names it).
        TypeError, ValueError: an engine option (dtype, max_batch, graph_buckets, ...) of the wrong type or range,
            named, before anything loads; the rule a recipe's keys follow. `path` and `official_tokenizer`
            are type-checked alike.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected the checkpoint directory (a string or path), got {type(path).__name__}")
    if not isinstance(official_tokenizer, bool):  # not a recipe key, but a flag like eager
        raise TypeError(f"official_tokenizer: expected true or false, got {type_name(type(official_tokenizer), True)}")
    # torch.bfloat16 -> "bfloat16" (as a torch.device is taken as its name below), then checked as that name is
    dtype, codec_dtype = (str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v for v in (dtype, codec_dtype))
    # "FLOAT32", " cpu " mean float32, cpu, as --dtype FLOAT32 and a recipe's dtype = "FLOAT32" do
    dtype, codec_dtype = folded("dtype", dtype), folded("codec_dtype", codec_dtype)
    for name, value in (("dtype", dtype), ("codec_dtype", codec_dtype), ("max_batch", max_batch), ("eager", eager),
                        ("deterministic", deterministic),
                        ("graph_buckets", graph_buckets), ("span_buckets", span_buckets),
                        ("max_prefill_tokens", max_prefill_tokens), ("codec_chunk_frames", codec_chunk_frames)):
        # None is a setting only where Args give it a meaning; elsewhere it reached the engine ("unsupported operand
        # type(s) for *: 'int' and 'NoneType'" at the first synthesize) or the loader (a CheckpointError)
        if problem := option_problem(name, value, optional=name in ("graph_buckets", "span_buckets",
                                                                    "max_prefill_tokens")):
            kind, message = problem
            raise kind(f"{name}: {message}")
    check_deterministic(deterministic, graph_buckets)  # before the checkpoint loads, as `TTS` would after
    if isinstance(device, torch.device):  # torch.device("cuda", 1) -> "cuda:1", checked as that name is
        device = str(device)
    if not isinstance(device, str):
        raise TypeError(f"device: expected cpu, cuda or npu (a string or torch.device), got "
                        f"{'None' if device is None else type_name(type(device), True)}")
    device = folded("device", device)
    if deterministic:
        if device == "npu":
            raise OmniTTSError("deterministic: not available on npu (cuda has it; the cpu is always deterministic)")
        if device == "cuda":  # cuBLAS's reproducibility setting, read when its first handle is made
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if device == "npu":
        from .device.npu import import_torch_npu

        import_torch_npu()  # before any tensor goes to the NPU
    elif device == "cuda" and not torch.cuda.is_available():
        raise OmniTTSError("device 'cuda': no CUDA device is visible to torch (load with device='cpu')")
    elif device not in ("cpu", "cuda"):
        if one := device_index(device):  # "cuda" means the current device: one per process
            kind, index = one
            raise OmniTTSError(f"device {device!r}: give the kind, {kind!r}, which runs on the process's current "
                               f"device: choose it first (torch.{kind}.set_device({index}) before loading, or "
                               f"{VISIBLE[kind]}={index} before Python starts; on the command line: --devices {device})")
        raise OmniTTSError(f"device {device!r}: choose cpu, cuda or npu")
    try:
        ckpt = load_checkpoint(path, device=device, dtype=dtype, official_tokenizer=official_tokenizer,
                               max_batch=max_batch, codec_dtype=codec_dtype)
    except Exception as exc:
        if not out_of_memory(exc):
            raise
        smaller = " choose a smaller --dtype (bfloat16)," if dtype == "float32" else ""
        said = " ".join(str(exc).split()) or type(exc).__name__
        raise OmniTTSError(f"{path}: the model does not fit in {device} memory while loading ({said});{smaller} "
                           "free memory or use a device with more") from None
    if deterministic:
        make_deterministic(ckpt.model.talker, ckpt.device)
    return TTS(ckpt, max_batch=max_batch, eager=eager, graph_buckets=graph_buckets,
               codec_chunk_frames=codec_chunk_frames, span_buckets=span_buckets,
               max_prefill_tokens=max_prefill_tokens, deterministic=deterministic)
