"""The text tokenizer of a checkpoint, with an opt-in switch that reproduces the official token ids.

By default text is tokenised exactly as the checkpoint's tokenizer files define (the Qwen2 byte-level
BPE with its own pre-tokenizer regex), as the model was trained and as vllm-omni does.

`official_regex=True` reproduces the official `qwen-tts` 0.1.1 wrapper, which loads the tokenizer with
`fix_mistral_regex=True`; under transformers 4.57.3 that swaps the first pre-tokenizer step for
Mistral's regex on these checkpoints, so e.g. "iPhone" is split before the capital. Use it only to
match the official package's token ids (parity checks).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from .cache import cache_root
from .errors import CheckpointError

_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "added_tokens.json")
_LOADED: dict[str, object] = {}  # digest of the tokenizer files -> loaded tokenizer (this process)

# The pattern transformers 4.57.3 installs when `fix_mistral_regex=True` (public regex, verbatim).
MISTRAL_PRETOKENIZER_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class TextTokenizer:
    """Text -> token ids, for the chat-wrapped strings the prompt builder asks for."""

    def __init__(self, ckpt: Path, official_regex: bool = False):
        import tokenizers

        ckpt = Path(ckpt)
        if not (ckpt / "tokenizer.json").exists() and not (ckpt / "vocab.json").exists():
            raise CheckpointError(f"{ckpt}: no text tokenizer files (expected vocab.json + merges.txt or tokenizer.json)")
        # A fresh backend object per instance: the official swap below edits its pre-tokenizer in place.
        self._tok = tokenizers.Tokenizer.from_str(_load_cached(ckpt))
        self.official_regex = official_regex
        if official_regex:
            pre = self._tok.pre_tokenizer
            if not isinstance(pre, tokenizers.pre_tokenizers.Sequence):
                raise CheckpointError(f"{ckpt}: tokenizer pre-tokenizer is not a Sequence; cannot apply the official regex")
            pre[0] = tokenizers.pre_tokenizers.Split(
                pattern=tokenizers.Regex(MISTRAL_PRETOKENIZER_REGEX), behavior="isolated"
            )

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def token_id(self, token: str) -> int:
        return self._tok.token_to_id(token)

    # The three chat wrappers the official prompt uses; ids are sliced by position afterwards.
    def assistant_ids(self, text: str) -> list[int]:
        return self.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")

    def reference_ids(self, text: str) -> list[int]:
        return self.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n")

    def instruct_ids(self, instruct: str) -> list[int]:
        return self.encode(f"<|im_start|>user\n{instruct}<|im_end|>\n")


def _load_cached(ckpt: Path) -> str:
    """The checkpoint's fast tokenizer as `tokenizer.json` text, converted from vocab.json + merges.txt once.

    Published checkpoints ship no tokenizer.json, so transformers would rebuild the fast tokenizer
    from the BPE files on every load (seconds for a 151k vocabulary, plus importing transformers'
    tokenizer stack). The conversion runs once through transformers and its `tokenizer.json` is kept
    under ~/.cache/omnitts/tokenizers/<digest of the files> and in memory; later loads read it with
    the `tokenizers` library alone and tokenize identically.
    """
    digest = hashlib.sha256()
    for name in _FILES:
        if (ckpt / name).is_file():
            digest.update(name.encode() + b"\0" + (ckpt / name).read_bytes())
    key = digest.hexdigest()[:24]
    if key in _LOADED:
        return _LOADED[key]
    cached = cache_root() / "tokenizers" / key
    if (cached / "tokenizer.json").is_file():
        _LOADED[key] = (cached / "tokenizer.json").read_text(encoding="utf-8")
        return _LOADED[key]
    try:
        # fix_mistral_regex=False: keep the checkpoint's own regex, and silence transformers' warning
        # about it (TextTokenizer applies the official swap itself when asked to).
        tok = _tokenizer_class(ckpt).from_pretrained(str(ckpt), local_files_only=True, fix_mistral_regex=False)
    except Exception as exc:  # transformers raises many types here; the file is what matters
        raise CheckpointError(f"{ckpt}: cannot load the text tokenizer ({type(exc).__name__}: {exc})") from None
    text = tok.backend_tokenizer.to_str()
    try:
        tmp = cached.with_name(f".{key}.{os.getpid()}.tmp")
        tok.save_pretrained(str(tmp))
        os.replace(tmp, cached)
    except OSError:  # a read-only or full cache, or another process won the race: only costs speed
        shutil.rmtree(tmp, ignore_errors=True)
    _LOADED[key] = text
    return text


# What AutoTokenizer resolves these checkpoints' `tokenizer_class` to, imported directly: importing
# AutoTokenizer pulls in transformers' generation stack and scikit-learn (about 3 of its 6 s here).
_QWEN2 = ("Qwen2Tokenizer", "Qwen2TokenizerFast")


def _tokenizer_class(ckpt: Path):
    """The fast tokenizer class for the checkpoint: Qwen2's for the published ones, else AutoTokenizer."""
    try:
        name = json.loads((ckpt / "tokenizer_config.json").read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        name = None  # no or odd config: let AutoTokenizer decide (and report)
    if name in _QWEN2:
        from transformers.models.qwen2.tokenization_qwen2_fast import Qwen2TokenizerFast

        return Qwen2TokenizerFast
    from transformers import AutoTokenizer

    return AutoTokenizer
