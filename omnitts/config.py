"""Checkpoint configuration: the parts of `config.json` and `speech_tokenizer/config.json` omnitts reads.

A Qwen3-TTS-12Hz checkpoint describes three networks (talker, code predictor, codec) plus, for Base
checkpoints, a speaker encoder. Every size and id is read from the files; where a field is absent we
use the default of the official `qwen-tts` 0.1.1 config classes, so any directory the official package
loads, omnitts loads the same way. Fields the runtime never reads (HF bookkeeping) are ignored.

This module knows nothing about tensors; `models/loader.py` turns these into modules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import CheckpointError
from .io import broken_link, unreachable

MODEL_TYPES = ("custom_voice", "voice_design", "base")
CODEC_IDS = ("codec_eos_token_id", "codec_think_id", "codec_nothink_id", "codec_think_bos_id", "codec_think_eos_id",
             "codec_pad_id", "codec_bos_id")  # the talker's special codec tokens
TOKENIZER_TYPE = "qwen3_tts_tokenizer_12hz"
TEXT_IDS = ("tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id")  # text tokens every prompt embeds


def read_json(path: Path) -> dict:
    """Read a JSON object from `path`, raising CheckpointError naming the file on any problem."""
    if why := broken_link(path):
        raise CheckpointError(f"{path}: {why}")
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found (is this a Qwen3-TTS-12Hz checkpoint directory?)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:  # another user's file of mode 0600 (a download by root), an I/O error: not its JSON
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object at the top level")
    return data


def _check_sizes(cls, data: dict, prefix: str) -> None:
    """Every integer field of dataclass `cls` that `data` gives is a positive integer (a size or a count; ids,
    `*_id`, may be 0 and are checked against the vocabulary where they are used): a string or a -1 would
    otherwise fail deep inside torch at the first synthesis, or show in `omnitts info` as if it were fine.
    `prefix`: what the message puts before the field's name ("FILE: section.")."""
    for f in fields(cls):
        value = data.get(f.name)
        if f.type not in ("int", "int | None") or value is None or f.name.endswith("_id"):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{prefix}{f.name}: expected a positive integer, got {value!r}")


_KINDS = {"dict": (dict, "a JSON object"), "dict | None": (dict, "a JSON object"), "list": (list, "a JSON array"),
          "float": ((int, float), "a number"), "bool": (bool, "true or false")}  # field type -> (JSON kind, its name)
# Number fields that are a base or a divisor's epsilon: a negative, zero or NaN one (Python's JSON reads NaN) made
# NaN rotations or norms, so NaN logits, at every synthesis without an error
POSITIVE_NUMBERS = ("rope_theta", "rms_norm_eps")


def _check_kinds(cls, data: dict, prefix: str) -> None:
    """Every object, array, number and flag field of dataclass `cls` that `data` gives has that JSON kind: another
    (`"spk_id": []`, a string `rms_norm_eps`) failed with an AttributeError naming neither file nor field, or
    deep inside torch at the first synthesis."""
    for f in fields(cls):
        value = data.get(f.name)
        kind, name = _KINDS.get(f.type, (None, None))
        if kind is not None and value is not None and (not isinstance(value, kind)
                                                       or (kind != bool and isinstance(value, bool))):
            raise CheckpointError(f"{prefix}{f.name}: expected {name}, got {value!r}")
        if f.name in POSITIVE_NUMBERS and value is not None and not 0 < value < float("inf"):
            raise CheckpointError(f"{prefix}{f.name}: expected a positive number, got {value!r}")


def _section(data: dict, key: str, where: str) -> dict:
    """`data[key]`, a config section: a JSON object ({} when absent or null)."""
    value = data.get(key)
    if value is not None and not isinstance(value, dict):
        raise CheckpointError(f"{where}{key}: expected a JSON object, got {value!r}")
    return value or {}


def _build(cls, data: dict, where: str):
    """Instantiate dataclass `cls` from the keys of `data` it declares; wrong types name the field."""
    _check_sizes(cls, data, f"{where}.")
    _check_kinds(cls, data, f"{where}.")
    kwargs = {f.name: data[f.name] for f in fields(cls) if f.name in data and f.init}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: {exc}") from None


@dataclass
class DecoderConfig:
    """A Qwen3-style decoder stack (talker or code predictor)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    hidden_act: str = "silu"
    attention_bias: bool = False
    vocab_size: int = 2048
    num_code_groups: int = 32

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act={self.hidden_act!r} is not supported (only 'silu')")


@dataclass
class TalkerConfig(DecoderConfig):
    """The talker LM: text + codec embeddings in, codebook-0 logits out."""

    hidden_size: int = 1024
    intermediate_size: int = 2048
    num_hidden_layers: int = 20
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    vocab_size: int = 3072
    text_vocab_size: int = 151936
    text_hidden_size: int = 2048
    rope_scaling: dict | None = None
    codec_eos_token_id: int = 4198
    codec_think_id: int = 4202
    codec_nothink_id: int = 4203
    codec_think_bos_id: int = 4204
    codec_think_eos_id: int = 4205
    codec_pad_id: int = 4196
    codec_bos_id: int = 4197
    spk_id: dict = field(default_factory=dict)
    spk_is_dialect: dict = field(default_factory=dict)
    codec_language_id: dict = field(default_factory=dict)
    max_position_embeddings: int = 32768  # positions the talker was trained for (prompt + frames)

    def __post_init__(self):
        super().__post_init__()
        self.spk_id = {str(k).lower(): v for k, v in (self.spk_id or {}).items()}
        self.spk_is_dialect = {str(k).lower(): v for k, v in (self.spk_is_dialect or {}).items()}
        self.codec_language_id = {str(k).lower(): v for k, v in (self.codec_language_id or {}).items()}
        scaling = self.rope_scaling or {}
        # The talker uses M-RoPE, but a TTS prompt gives all three position streams the same index,
        # so every mrope section rotates by the same angle: it is ordinary RoPE. Anything else would
        # need real multimodal positions, which no TTS checkpoint uses.
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_scaling.rope_type={rope_type!r} is not supported (only 'default')")
        for name, value in self.spk_id.items():
            if isinstance(value, list):
                if len(value) != 1:
                    raise ValueError(f"spk_id[{name!r}] must be one codec id, got {value}")
                self.spk_id[name] = value[0]
        # Every id below indexes the codec embedding (vocab_size rows, the loaded tensor's shape): one outside
        # it would be an IndexError in the first synthesis that uses it, so it is refused here.
        ids = [(name, getattr(self, name)) for name in CODEC_IDS]
        ids += [(f"spk_id[{k!r}]", v) for k, v in self.spk_id.items()]
        ids += [(f"codec_language_id[{k!r}]", v) for k, v in self.codec_language_id.items()]
        for name, value in ids:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ValueError(f"{name}={value!r} is not a codec id: the codec embedding has vocab_size="
                                 f"{self.vocab_size} rows (ids 0..{self.vocab_size - 1})")
        for name, dialect in self.spk_is_dialect.items():  # a dialect speaker speaks its dialect's language id
            if dialect and (not isinstance(dialect, str) or dialect not in self.codec_language_id):
                raise ValueError(f"spk_is_dialect[{name!r}]={dialect!r} is not a language of codec_language_id "
                                 f"({', '.join(self.codec_language_id)})")

    @property
    def languages(self) -> list[str]:
        """Language names a request may ask for ("auto" plus every non-dialect language id)."""
        return ["auto"] + [name for name in self.codec_language_id if "dialect" not in name]

    def knows_language(self, name: str) -> bool:
        """Whether `name` (lower case) is in `languages`, without building the list (a check per manifest line)."""
        return name == "auto" or (name in self.codec_language_id and "dialect" not in name)

    @property
    def speakers(self) -> list[str]:
        return list(self.spk_id)


@dataclass
class SpeakerEncoderConfig:
    """ECAPA-TDNN speaker encoder of Base checkpoints (x-vector of talker-hidden size)."""

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: list = field(default_factory=lambda: [512, 512, 512, 512, 1536])
    enc_kernel_sizes: list = field(default_factory=lambda: [5, 3, 3, 3, 1])
    enc_dilations: list = field(default_factory=lambda: [1, 2, 3, 4, 1])
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    def __post_init__(self):
        if not len(self.enc_channels) == len(self.enc_kernel_sizes) == len(self.enc_dilations):
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations must have the same length")


@dataclass
class CodecDecoderConfig:
    """The 12 Hz codec decoder: 16 codes per frame to 1920 samples at 24 kHz."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    hidden_size: int = 1024
    latent_dim: int = 1024
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int | None = None
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    rms_norm_eps: float = 1e-5
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: list = field(default_factory=lambda: [8, 5, 4, 3])
    upsampling_ratios: list = field(default_factory=lambda: [2, 2])
    decoder_dim: int = 1536

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        self.upsample_rates = list(self.upsample_rates)
        self.upsampling_ratios = list(self.upsampling_ratios)

    @property
    def samples_per_frame(self) -> int:
        total = 1
        for r in self.upsample_rates + self.upsampling_ratios:
            total *= r
        return total


@dataclass
class CodecConfig:
    """`speech_tokenizer/config.json`: the Mimi encoder (reference audio) and our decoder."""

    decoder: CodecDecoderConfig
    encoder: dict  # passed verbatim to transformers.MimiConfig
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920


@dataclass
class ModelConfig:
    """Everything omnitts reads from one checkpoint directory's config files."""

    model_type: str  # custom_voice | voice_design | base
    model_size: str  # "0b6", "1b7", ... (as the checkpoint names it)
    talker: TalkerConfig
    predictor: DecoderConfig
    speaker_encoder: SpeakerEncoderConfig | None
    codec: CodecConfig
    generation: dict  # generation_config.json (sampling defaults)
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    path: Path | None = None  # the checkpoint directory these were read from (saved voices are checked against it)

    @property
    def accepts_instruct(self) -> bool:
        """Whether an instruction reaches the model (the official wrapper drops it on 0.6B CustomVoice)."""
        if self.model_type == "voice_design":
            return True
        # The official wrapper tests `tts_model_size in "0b6"` (a substring test); we mirror it.
        return self.model_type == "custom_voice" and self.model_size not in "0b6"


def load_config(ckpt: Path) -> ModelConfig:
    """Read and validate the config files of checkpoint directory `ckpt`."""
    ckpt = Path(ckpt)
    if why := unreachable(ckpt):
        raise CheckpointError(f"{ckpt}: cannot read checkpoint directory ({why})")
    if ckpt.exists() and not ckpt.is_dir():
        inside = (ckpt.parent / "config.json").is_file()  # a file of the checkpoint (its config, its weights)
        raise CheckpointError(f"{ckpt}: is a file; a checkpoint is a directory (the folder holding config.json"
                              + (f": {ckpt.parent}, which holds this file)" if inside else ")"))
    if not ckpt.is_dir():
        raise CheckpointError(f"{ckpt}: checkpoint directory not found")
    path = ckpt / "config.json"
    if not path.exists() and not path.is_symlink() and (snapshot := _hub_snapshot(ckpt)):
        raise CheckpointError(f"{ckpt}: is a Hugging Face cache folder; give the checkpoint inside it, its snapshot "
                              f"({snapshot})")
    top = read_json(path)
    tokenizer_type = top.get("tokenizer_type")
    if tokenizer_type is None and top.get("model_type") == TOKENIZER_TYPE:  # "not supported" said of a good checkpoint
        raise CheckpointError(f"{ckpt}: is a checkpoint's codec folder (its speech_tokenizer/); give the checkpoint "
                              f"directory that holds it ({ckpt.resolve().parent})")
    if tokenizer_type != TOKENIZER_TYPE:
        raise CheckpointError(
            f"{path}: tokenizer_type={tokenizer_type!r} is not supported; omnitts runs "
            f"{TOKENIZER_TYPE!r} checkpoints (Qwen3-TTS-12Hz-*)"
        )
    model_type = top.get("tts_model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(f"{path}: tts_model_type={model_type!r} is not one of {', '.join(MODEL_TYPES)}")
    talker_raw = top.get("talker_config")
    if not isinstance(talker_raw, dict):
        raise CheckpointError(f"{path}: missing field talker_config")
    talker = _build(TalkerConfig, talker_raw, f"{path}: talker_config")
    predictor_raw = _section(talker_raw, "code_predictor_config", f"{path}: talker_config.")
    predictor = _build(DecoderConfig, {**_PREDICTOR_DEFAULTS, **predictor_raw}, f"{path}: talker_config.code_predictor_config")
    if predictor.num_code_groups != talker.num_code_groups:
        raise CheckpointError(f"{path}: code_predictor_config.num_code_groups differs from talker_config's")
    speaker_encoder = None
    if model_type == "base":
        speaker_encoder = _build(SpeakerEncoderConfig, _section(top, "speaker_encoder_config", f"{path}: "),
                                 f"{path}: speaker_encoder_config")
    ids = {k: top[k] for k in ("im_start_token_id", "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id") if k in top}
    for name in TEXT_IDS:  # rows of the text embedding in every prompt: else torch's bare IndexError at synthesis
        value = ids.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value < talker.text_vocab_size):
            rows = talker.text_vocab_size
            raise CheckpointError(f"{path}: {name}={value!r} is not a text token id: the text embedding has "
                                  f"text_vocab_size={rows} rows (ids 0..{rows - 1})")
    gen_path = ckpt / "generation_config.json"
    generation = read_json(gen_path) if gen_path.exists() else {}
    _check_generation(generation, gen_path)
    return ModelConfig(
        model_type=model_type,
        model_size=str(top.get("tts_model_size") or ""),
        talker=talker,
        predictor=predictor,
        speaker_encoder=speaker_encoder,
        codec=load_codec_config(ckpt / "speech_tokenizer"),
        generation=generation,
        **ids,
        path=ckpt,
    )


def _hub_snapshot(folder: Path) -> Path | None:
    """The snapshot a Hugging Face cache folder (`models--Qwen--X/`: blobs/, refs/, snapshots/<commit>/) holds the
    checkpoint in: the one refs/main names, else the newest; None for another folder."""
    try:
        snapshots = sorted((p for p in (folder / "snapshots").iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        main = (folder / "refs" / "main").read_text().strip() if (folder / "refs" / "main").is_file() else ""
    except OSError:
        return None
    named = [p for p in snapshots if main and p.name == main]
    return (named or snapshots or [None])[-1]


def _check_generation(generation: dict, path: Path) -> None:
    """Build the sampling defaults once, so a bad value fails here, naming the file and field, and not
    every synthesis later."""
    from .params import SamplingParams  # imports torch: only once a checkpoint's files are being read

    try:
        SamplingParams.from_generation_config(generation)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: {exc}; correct the field or remove it (the official default applies)") from None


# Defaults of the official Qwen3TTSTalkerCodePredictorConfig.
_PREDICTOR_DEFAULTS = dict(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, vocab_size=2048, num_code_groups=32,
)


def load_codec_config(folder: Path) -> CodecConfig:
    path = folder / "config.json"
    raw = read_json(path)
    model_type = raw.get("model_type")
    if model_type != TOKENIZER_TYPE:
        raise CheckpointError(f"{path}: model_type={model_type!r}, expected {TOKENIZER_TYPE!r}")
    decoder = _build(CodecDecoderConfig, _section(raw, "decoder_config", f"{path}: "), f"{path}: decoder_config")
    keys = ("encoder_valid_num_quantizers", "input_sample_rate", "output_sample_rate",
            "decode_upsample_rate", "encode_downsample_rate")
    _check_sizes(CodecConfig, raw, f"{path}: ")
    codec = CodecConfig(decoder=decoder, encoder=dict(_section(raw, "encoder_config", f"{path}: ")),
                        **{k: raw[k] for k in keys if k in raw})
    if codec.decode_upsample_rate != decoder.samples_per_frame:
        raise CheckpointError(
            f"{path}: decode_upsample_rate={codec.decode_upsample_rate} but the decoder's upsampling "
            f"rates multiply to {decoder.samples_per_frame}"
        )
    return codec


def config_summary(cfg: ModelConfig) -> dict[str, Any]:
    """A flat, printable description of a checkpoint (used by `omnitts info` and the API)."""
    return {
        "kind": cfg.model_type,
        "size": cfg.model_size,
        "talker_hidden": cfg.talker.hidden_size,
        "talker_layers": cfg.talker.num_hidden_layers,
        "predictor_layers": cfg.predictor.num_hidden_layers,
        "code_groups": cfg.talker.num_code_groups,
        "speakers": cfg.talker.speakers,
        "languages": cfg.talker.languages,
        "accepts_instruct": cfg.accepts_instruct,
        "sample_rate": cfg.codec.output_sample_rate,
    }
