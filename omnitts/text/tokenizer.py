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
from pathlib import Path

from ..errors import CheckpointError
from ..io import broken_link

_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "added_tokens.json")
_CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")  # every prompt's role markers: one added token each
_LOADED: dict[str, str] = {}  # digest of the tokenizer files -> tokenizer.json text (this process)

# The Qwen2 pre-tokenizer regex, as the published checkpoints' tokenizer defines it (public regex, verbatim).
QWEN2_PRETOKENIZER_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

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
        for name in _FILES:
            if why := broken_link(ckpt / name):
                raise CheckpointError(f"{ckpt / name}: {why}")
        if not (ckpt / "tokenizer.json").exists() and not (ckpt / "vocab.json").exists():
            raise CheckpointError(f"{ckpt}: no text tokenizer files (expected vocab.json + merges.txt or tokenizer.json)")
        if not (ckpt / "tokenizer.json").exists() and not (ckpt / "merges.txt").exists():
            raise CheckpointError(f"{ckpt / 'merges.txt'}: file not found (the text tokenizer is vocab.json + merges.txt, "
                                  "or tokenizer.json)")
        # A fresh backend object per instance: the official swap below edits its pre-tokenizer in place.
        self._tok = _backend(ckpt)
        _check_chat_tokens(ckpt, self._tok)
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


def _check_chat_tokens(ckpt: Path, tok) -> None:
    """CheckpointError unless `tok` has <|im_start|> and <|im_end|> as tokens: without them (a checkpoint missing its
    tokenizer_config.json, which defines them) every prompt's markers would be spelled out as BPE pieces, silently."""
    missing = [token for token in _CHAT_TOKENS if tok.token_to_id(token) is None]
    if not missing:
        return
    source = ckpt / ("tokenizer.json" if (ckpt / "tokenizer.json").is_file() else "tokenizer_config.json")
    if not source.is_file():
        raise CheckpointError(f"{source}: file not found; it defines the tokens {' and '.join(_CHAT_TOKENS)} every "
                              f"prompt uses (copy it from the checkpoint's download)")
    raise CheckpointError(f"{source}: defines no token {missing[0]}; every prompt uses {' and '.join(_CHAT_TOKENS)} "
                          f"(is it this checkpoint's file?)")


def _backend(ckpt: Path):
    """A fresh `tokenizers.Tokenizer` for the checkpoint.

    A checkpoint that ships a `tokenizer.json` is read as it is. The published ones ship only the
    Qwen2 byte-level BPE files (vocab.json, merges.txt, tokenizer_config.json), from which
    `_qwen2_from_bpe_files` builds the fast tokenizer with the `tokenizers` library alone, the same
    document transformers 4.57 converts them to (and the same ids as 5.x), without importing
    transformers: ~0.2 s a process on the test files, where transformers' import and conversion took
    1.0-2.1 s and reading back its cached conversion ~0.2 s. Later instances in the process are copies
    of the first, through its `tokenizer.json` text.
    """
    from tokenizers import Tokenizer

    digest = hashlib.sha256()
    for name in _FILES:
        if (ckpt / name).is_file():
            digest.update(name.encode() + b"\0" + (ckpt / name).read_bytes())
    key = digest.hexdigest()[:24]
    if key not in _LOADED:
        if not (ckpt / "tokenizer.json").is_file():
            tok = _qwen2_from_bpe_files(ckpt)
            _LOADED[key] = tok.to_str()
            return tok  # the first instance is the built object itself (no text round trip)
        _LOADED[key] = (ckpt / "tokenizer.json").read_text(encoding="utf-8")
    try:
        return Tokenizer.from_str(_LOADED[key])
    except Exception as exc:  # only a shipped tokenizer.json can be malformed here
        raise CheckpointError(f"{ckpt / 'tokenizer.json'}: not a tokenizers document ({exc})") from None


# What `tokenizer_class` names in a checkpoint whose vocab.json + merges.txt are a Qwen2 byte-level BPE.
_QWEN2 = ("Qwen2Tokenizer", "Qwen2TokenizerFast")


def set_qwen2_pretokenization(tok) -> None:
    """Give a `tokenizers.Tokenizer` Qwen2's text preparation: NFC, then the Qwen2 regex split, then bytes
    to byte-level symbols (what the test checkpoints' BPE is trained under, too)."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZER_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _qwen2_from_bpe_files(ckpt: Path):
    """A `tokenizers.Tokenizer` from Qwen2's slow-tokenizer files: the byte-level BPE with NFC, the Qwen2
    pre-tokenizer regex, and the added tokens of tokenizer_config.json at the ids it gives them."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    config_path = path = ckpt / "tokenizer_config.json"  # `path`: the file being read, for the error
    try:
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        vocab = json.loads((path := ckpt / "vocab.json").read_text(encoding="utf-8"))
        lines = (path := ckpt / "merges.txt").read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read this text tokenizer file ({type(exc).__name__}: {exc})") from None
    if not isinstance(config, dict) or config.get("tokenizer_class", "Qwen2Tokenizer") not in _QWEN2:
        name = config.get("tokenizer_class") if isinstance(config, dict) else None
        raise CheckpointError(f"{config_path}: tokenizer_class {name!r} is not supported without a tokenizer.json "
                              f"(omnitts builds {' / '.join(_QWEN2)} from vocab.json + merges.txt)")
    merges = []
    for number, line in enumerate(lines, 1):
        pair = line.split()
        if not pair or (number == 1 and line.startswith("#version")):
            continue
        if len(pair) != 2:
            raise CheckpointError(f"{ckpt / 'merges.txt'}:{number}: expected two symbols separated by a space")
        merges.append((pair[0], pair[1]))
    try:
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                                   continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                                   byte_fallback=False))
    except Exception as exc:  # tokenizers raises plain Exceptions (a merge of unknown symbols, a vocab that is no map)
        raise CheckpointError(f"{ckpt}: vocab.json and merges.txt do not make a BPE tokenizer ({exc})") from None
    set_qwen2_pretokenization(tok)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    try:
        added = sorted((int(i), t) for i, t in (config.get("added_tokens_decoder") or {}).items())
        tok.add_tokens([AddedToken(t["content"], single_word=t.get("single_word", False), lstrip=t.get("lstrip", False),
                                   rstrip=t.get("rstrip", False), normalized=t.get("normalized", True),
                                   special=t.get("special", False)) for _, t in added])
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise CheckpointError(f"{config_path}: added_tokens_decoder is malformed "
                              f"({type(exc).__name__}: {exc})") from None
    for token_id, token in added:
        # Added tokens take the ids after the vocabulary, in id order: the file's ids must be those.
        if tok.token_to_id(token["content"]) != token_id:
            raise CheckpointError(f"{config_path}: added token {token['content']!r} has id {token_id}, but "
                                  f"vocab.json ({len(vocab)} entries) puts it at {tok.token_to_id(token['content'])}")
    return tok
