"""Engine settings for one kind of machine, read from a TOML recipe (see recipes/) and validated once.

    device = "cuda"
    dtype = "bfloat16"
    codec_dtype = "float32"
    max_batch = 32
    graph_buckets = [1, 2, 4, 8, 16, 32]
    span_buckets = [256, 512, 1024, 2048, 4096]
    codec_chunk_frames = 25

    [env]
    PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True"

Every key is optional: what a recipe leaves out stays with the command-line flag or the built-in
default. Names (device, dtype, codec_dtype) are read in any case, as the flags read them. Unknown keys
and wrong types raise `RecipeError` naming the file and key. `[env]` holds environment variables
(allocator settings) that must be set before torch / torch_npu initialise the device; `apply_env`
sets them without overriding variables the user already exported.
This module knows nothing about torch.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from .errors import OmniTTSError, did_you_mean, type_label

DEVICES = ("cpu", "cuda", "npu")
VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}  # what picks a process's devices


def device_index(device) -> tuple[str, str] | None:
    """(kind, index) where `device` is torch's name of one accelerator ("cuda:1"), else None: omnitts takes the
    kind, and a process runs on its current device (the variable in VISIBLE chooses which)."""
    kind, _, index = str(device).partition(":")
    return (kind, index) if kind in VISIBLE and index.isdigit() else None
DTYPES = ("auto", "float32", "bfloat16", "float16")
# The codec decoder runs in float32 unless asked (the official package decodes in the model's dtype):
# bfloat16 costs quality and, on CPUs with native bf16, is no faster than the Winograd float32 codec that
# bfloat16 runs already use (docs/performance.md).
CODEC_DTYPES = ("float32", "bfloat16")


class RecipeError(OmniTTSError):
    """A recipe file that cannot be used (the message names the file and key)."""


@dataclass
class Recipe:
    """Engine settings from one recipe file; None means "not set by the recipe".

    Attributes:
        device: cpu | cuda | npu.
        dtype: auto | float32 | bfloat16 | float16 (language models).
        codec_dtype: float32 | bfloat16 (the codec decoder; bfloat16 is faster and lossier).
        max_batch: requests decoded together at most (>= 1).
        eager: never capture device graphs.
        deterministic: cuda: a line's codes do not depend on its batch mates (`omnitts.load`).
        graph_buckets: batch sizes that get a captured graph, e.g. [1, 2, 4, 8] (max_batch always does).
        span_buckets: attention spans (talker positions) that get a captured graph per batch bucket,
            e.g. [256, 512, 1024] (the engine's max_positions always does).
        max_prefill_tokens: prompt positions admitted (prefilled) per engine step at most (>= 1).
        codec_chunk_frames: frames per codec decode chunk (> 0); read by the streaming codec decoder.
        env: environment variables to set before the device initialises (strings).
        path: the file it came from (for messages).
    """

    device: str | None = None
    dtype: str | None = None
    codec_dtype: str | None = None
    max_batch: int | None = None
    eager: bool | None = None
    deterministic: bool | None = None
    graph_buckets: list[int] | None = None
    span_buckets: list[int] | None = None
    max_prefill_tokens: int | None = None
    codec_chunk_frames: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    path: Path | None = None

    def __post_init__(self):
        where = f"{self.path or 'recipe'}"
        for name in _CHOICES:  # `dtype = "FLOAT32"` means float32, as `--dtype FLOAT32` does
            setattr(self, name, folded(name, getattr(self, name)))
        for name in _KINDS:
            if problem := option_problem(name, getattr(self, name)):
                raise RecipeError(f"{where}: {name}: {problem[1]}")
        for key, value in self.env.items():
            if not isinstance(value, str):
                raise RecipeError(f"{where}: env.{key}: expected a string, got {type_name(type(value), given=True)}")
            # What the environment cannot hold (os.environ raised it, a traceback, as the run started).
            if not key or "=" in key or "\0" in key:
                raise RecipeError(f"{where}: env: {key!r} is not an environment variable's name (not empty, no '=' "
                                  "or NUL)")
            if "\0" in value:
                raise RecipeError(f"{where}: env.{key}: a NUL character cannot be in an environment variable")

    def engine_options(self) -> dict:
        """The settings this recipe gives that `omnitts.load` takes (device, dtype, max_batch, ...)."""
        names = ("device", "dtype", "codec_dtype", "max_batch", "eager", "deterministic", "graph_buckets",
                 "span_buckets", "max_prefill_tokens", "codec_chunk_frames")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


KEYS = tuple(f.name for f in fields(Recipe) if f.name != "path")
_KINDS = {"device": str, "dtype": str, "codec_dtype": str, "max_batch": int, "eager": bool, "deterministic": bool,
          "codec_chunk_frames": int, "max_prefill_tokens": int, "graph_buckets": list, "span_buckets": list,
          "env": dict}
_CHOICES = {"device": DEVICES, "dtype": DTYPES, "codec_dtype": CODEC_DTYPES}
_SIZES = {"graph_buckets": "batch sizes", "span_buckets": "position counts"}


def folded(name: str, value):
    """Engine option `name`'s value as its lower-case name where, folded, it is one (" Float32 " -> "float32",
    "CUDA:1" -> "cuda:1", as the flags read them); anything else as given, to be refused as written."""
    if not isinstance(value, str):
        return value
    name_of = value.strip().lower()
    return name_of if name_of in _CHOICES[name] or (name == "device" and device_index(name_of)) else value


def option_problem(name: str, value, optional: bool = True) -> tuple[type[Exception], str] | None:
    """What is wrong with engine option `name` set to `value`, as (TypeError or ValueError, message without
    the name), or None: nothing (None itself means "not set", unless not `optional`: `omnitts.load`'s max_batch
    has no default left to fall back on). One rule for recipes and `omnitts.load`.
    Integers may be numpy's; lists of sizes may be tuples."""
    kind = _KINDS[name]
    if value is None:
        return None if optional else (TypeError, f"expected {type_name(kind)}, got None")
    if kind is int:
        fits = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    else:
        fits = isinstance(value, (list, tuple) if kind is list else kind)
    if not fits:
        return TypeError, f"expected {type_name(kind)}, got {type_name(type(value), given=True)}"
    if name == "device" and (one := device_index(value)):  # torch's name of one device, as --device cuda:0
        kind, index = one
        return ValueError, (f"{value!r}: give the kind, {kind!r}; to run on device {index}: --devices {value}, or "
                            f"{VISIBLE[kind]}={index} before the command")
    if name in _CHOICES and value not in _CHOICES[name]:
        return ValueError, f"{value!r} is not one of {', '.join(_CHOICES[name])}"
    if kind is int and value < 1:
        return ValueError, f"must be > 0, got {value}"
    if name in _SIZES:
        if not value or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 1 for s in value):
            return ValueError, f"expected a list of {_SIZES[name]} >= 1, got {list(value)}"
        if list(value) != sorted(set(value)):
            return ValueError, f"list each size once, in increasing order, got {list(value)}"
    return None


def type_name(kind, given: bool = False) -> str:
    """How a type is named in "expected X, got Y" (`given`: as Y, where bool is the value's kind)."""
    if kind is bool:
        return "a boolean" if given else "true or false"
    names = {str: "a string", int: "an integer", list: "a list", dict: "a table", float: "a number"}
    return names.get(kind, type_label(kind))


def load_recipe(path) -> Recipe:
    """Read and validate recipe file `path` (TOML).

    Raises:
        RecipeError: the file is missing or not TOML, has an unknown key (the valid ones are
            listed), or a value of the wrong type or range (the key is named).
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    path = Path(path)
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8-sig"))  # (a byte order mark, as Windows editors write, is dropped)
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise RecipeError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at line {line}, column {column}; "
                          "save the file as UTF-8)") from None
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{path}: not valid TOML ({exc})") from None
    unknown = [key for key in data if key not in KEYS]
    if unknown:
        raise RecipeError(f"{path}: {unknown[0]}: unknown key{did_you_mean(unknown[0], KEYS)}; valid keys are "
                          f"{', '.join(KEYS)}")
    return Recipe(**data, path=path)


def apply_env(recipe: Recipe, environ=None) -> dict[str, str]:
    """Set the recipe's [env] variables that are not already set; return the ones it set.

    Call it before torch / torch_npu touch the device (allocator settings are read once, then).
    A variable the user exported wins over the recipe.
    """
    environ = os.environ if environ is None else environ
    applied = {key: value for key, value in recipe.env.items() if key not in environ}
    environ.update(applied)
    return applied
