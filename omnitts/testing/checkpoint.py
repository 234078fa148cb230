"""Random-initialised checkpoints in the exact published Qwen3-TTS-12Hz layout.

No real weights exist on our machines, so tests, the demo and benchmarks run on checkpoints this
module writes: config.json, generation_config.json, model.safetensors, the text tokenizer files, and
speech_tokenizer/{config.json, preprocessor_config.json, model.safetensors}. Shapes come from a
preset: `tiny-0.6b` / `tiny-1.7b` (seconds to build; the talker/predictor relation of the real sizes:
equal hidden sizes with an identity projection, or a wider talker with a real
`small_to_mtp_projection`), `layers-0.6b` / `layers-1.7b` (tiny widths, the real layer counts: for
counting a frame's ops) and `0.6b` / `1.7b` (the real shapes, for benchmarks).

Random weights give near-uniform logits, so greedy argmax would hinge on 1e-6 differences. The output
heads are scaled up so the top-1/top-2 margins are decisive; parity reports the smallest margin seen.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch

from ..config import TOKENIZER_TYPE, load_config
from ..io.atomic import file_mode
from ..models.codec_encoder import mimi_encoder, published_layout
from .text_tokenizer import write_text_tokenizer

SPEAKERS = {"ryan": 3061, "vivian": 3065, "serena": 3066, "aiden": 2861, "eric": 2875, "dylan": 2878}
DIALECTS = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
             "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069}
DIALECT_IDS = {"beijing_dialect": 2074, "sichuan_dialect": 2062}

# (talker, predictor, text hidden, codec decoder, mimi) sizes per preset.
PRESETS = {
    "tiny-0.6b": dict(size="0b6", talker=(64, 128, 2, 4, 2, 16), predictor=(64, 128, 2, 4, 2, 16), text_hidden=32,
                      codec=(32, 32, 32, 64, 2, 2, 16, 64), mimi=(32, 4, 2, 2, 16, 64, 32)),
    "tiny-1.7b": dict(size="1b7", talker=(96, 160, 2, 4, 2, 24), predictor=(64, 128, 2, 4, 2, 16), text_hidden=48,
                      codec=(32, 32, 32, 64, 2, 2, 16, 64), mimi=(32, 4, 2, 2, 16, 64, 32)),
    "0.6b": dict(size="0b6", talker=(1024, 3072, 28, 16, 8, 128), predictor=(1024, 3072, 5, 16, 8, 128), text_hidden=2048,
                 codec=(512, 512, 1024, 1536, 8, 16, 64, 1024), mimi=(512, 64, 8, 8, 64, 2048, 256)),
    "1.7b": dict(size="1b7", talker=(2048, 6144, 28, 16, 8, 128), predictor=(1024, 3072, 5, 16, 8, 128), text_hidden=2048,
                 codec=(512, 512, 1024, 1536, 8, 16, 64, 1024), mimi=(512, 64, 8, 8, 64, 2048, 256)),
}


def _layer_counts(shape: tuple, layers: int) -> tuple:
    """A decoder's (hidden, intermediate, layers, heads, kv heads, head dim) with another layer count."""
    return shape[:2] + (layers,) + shape[3:]


# `layers-0.6b` / `layers-1.7b`: the real layer counts (28 talker, 5 predictor layers) at the tiny widths,
# for counting a frame's ops (testing/opcount.py): how many ops a frame runs depends on layer counts,
# batch and sampling, not on widths.
for _size in ("0.6b", "1.7b"):
    _tiny = PRESETS[f"tiny-{_size}"]
    PRESETS[f"layers-{_size}"] = dict(_tiny, talker=_layer_counts(_tiny["talker"], 28),
                                      predictor=_layer_counts(_tiny["predictor"], 5))
HEAD_SCALE = 100.0  # makes greedy top-1/top-2 logit gaps decisive on random weights


def _decoder(hidden, inter, layers, heads, kv, head_dim, **extra):
    return dict(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, head_dim=head_dim, hidden_act="silu", rms_norm_eps=1e-6,
                rope_theta=1000000, attention_bias=False, max_position_embeddings=32768, **extra)


def make_config(kind: str, preset: str) -> dict:
    """The top-level config.json of a checkpoint of `kind` with `preset` shapes."""
    p = PRESETS[preset]
    head_dim = p["talker"][5]
    quarter = head_dim // 8
    talker = _decoder(*p["talker"], vocab_size=3072, text_vocab_size=151936, text_hidden_size=p["text_hidden"],
                      num_code_groups=16, position_id_per_seconds=13,
                      rope_scaling={"interleaved": True, "mrope_section": [head_dim // 2 - 2 * quarter, quarter, quarter],
                                    "rope_type": "default"},
                      codec_bos_id=2149, codec_eos_token_id=2150, codec_pad_id=2148, codec_think_id=2154,
                      codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157)
    talker["code_predictor_config"] = _decoder(*p["predictor"], vocab_size=2048, num_code_groups=16)
    languages = dict(LANGUAGES)
    if kind == "custom_voice":
        languages.update(DIALECT_IDS)
        talker["spk_id"] = dict(SPEAKERS)
        talker["spk_is_dialect"] = {name: DIALECTS.get(name, False) for name in SPEAKERS}
    else:
        talker["spk_id"], talker["spk_is_dialect"] = {}, {}
    talker["codec_language_id"] = languages
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
        "tokenizer_type": TOKENIZER_TYPE, "tts_model_size": p["size"], "tts_model_type": kind,
        "im_start_token_id": 151644, "im_end_token_id": 151645, "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672, "tts_eos_token_id": 151673, "assistant_token_id": 77091,
        "torch_dtype": "float32", "transformers_version": "4.57.3", "talker_config": talker,
    }
    if kind == "base":
        config["speaker_encoder_config"] = {"enc_dim": p["talker"][0], "sample_rate": 24000}
    return config


def make_codec_config(preset: str) -> dict:
    codebook_dim, hidden, latent, decoder_dim, layers, heads, head_dim, inter = PRESETS[preset]["codec"]
    m_hidden, m_filters, m_layers, m_heads, m_head_dim, m_inter, m_cb_dim = PRESETS[preset]["mimi"]
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": TOKENIZER_TYPE,
        "encoder_valid_num_quantizers": 16, "input_sample_rate": 24000, "output_sample_rate": 24000,
        "decode_upsample_rate": 1920, "encode_downsample_rate": 1920, "transformers_version": "4.57.3",
        "decoder_config": {
            "codebook_size": 2048, "codebook_dim": codebook_dim, "hidden_size": hidden, "latent_dim": latent,
            "decoder_dim": decoder_dim, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": heads, "head_dim": head_dim, "intermediate_size": inter,
            "sliding_window": 72, "rope_theta": 10000, "rms_norm_eps": 1e-5, "layer_scale_initial_scale": 0.01,
            "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "max_position_embeddings": 8000,
            "num_quantizers": 16, "hidden_act": "silu", "attention_bias": False,
            # Unused by the decoder, but in the published file (converters such as vox-tts read them).
            "num_semantic_quantizers": 1, "semantic_codebook_size": 4096,
            "vector_quantization_hidden_dimension": codebook_dim,
        },
        "encoder_config": {
            "model_type": "mimi", "sampling_rate": 24000, "frame_rate": 12.5, "audio_channels": 1,
            "hidden_size": m_hidden, "num_filters": m_filters, "num_residual_layers": 1,
            "upsampling_ratios": [8, 6, 5, 4], "kernel_size": 7, "last_kernel_size": 3, "residual_kernel_size": 3,
            "dilation_growth_rate": 2, "use_causal_conv": True, "pad_mode": "constant", "compress": 2,
            "trim_right_ratio": 1.0, "codebook_size": 2048, "codebook_dim": m_cb_dim, "num_quantizers": 32,
            "num_semantic_quantizers": 1, "vector_quantization_hidden_dimension": m_cb_dim,
            "upsample_groups": m_hidden, "num_hidden_layers": m_layers, "intermediate_size": m_inter,
            "num_attention_heads": m_heads, "num_key_value_heads": m_heads, "head_dim": m_head_dim,
            "hidden_act": "gelu", "max_position_embeddings": 8000, "rope_theta": 10000.0,
            "sliding_window": 250, "layer_scale_initial_scale": 0.01, "use_conv_shortcut": False,
            "norm_eps": 1e-5, "attention_dropout": 0.0, "initializer_range": 0.02,
        },
    }


GENERATION_CONFIG = {
    "do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
    "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
    "max_new_tokens": 8192,
}


def _randomise(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Give every floating tensor fresh deterministic random values of a sensible scale."""
    for name, tensor in module.state_dict().items():
        if not tensor.is_floating_point():
            continue
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("scale", "gamma"):  # layer scales keep their small initial values
            continue
        if leaf == "weight" and tensor.dim() == 1:  # norms
            tensor.copy_(1.0 + 0.1 * torch.randn(tensor.shape, generator=gen))
        elif leaf in ("alpha", "beta"):  # SnakeBeta log-scales
            tensor.copy_(0.1 * torch.randn(tensor.shape, generator=gen))
        elif leaf == "cluster_usage":
            tensor.copy_(torch.rand(tensor.shape, generator=gen) + 0.5)
        elif leaf in ("embedding_sum", "embed_sum"):
            tensor.copy_(torch.randn(tensor.shape, generator=gen))
        elif tensor.dim() >= 2:
            fan_in = tensor[0].numel()
            tensor.copy_(torch.randn(tensor.shape, generator=gen) / fan_in**0.5)
        elif leaf == "bias":
            tensor.copy_(0.02 * torch.randn(tensor.shape, generator=gen))


def _save(tensors: dict, path: Path, dtype: torch.dtype) -> None:
    """Write a weight file with the mode the checkpoint's JSON files get (0666 less the umask)."""
    from safetensors.torch import save_file

    out = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    save_file(out, str(path), metadata={"format": "pt"})
    os.chmod(path, file_mode())  # safetensors writes a new file of mode 0600


@torch.no_grad()
def build_checkpoint(folder, kind: str = "custom_voice", preset: str = "tiny-0.6b", seed: int = 0,
                     dtype: str = "float32", eos_scale: float = 0.0) -> Path:
    """Write a random checkpoint of `kind` (custom_voice|voice_design|base) and `preset` shapes to `folder`.

    `eos_scale` scales the EOS row of the codebook-0 head: 0 (default) makes EOS all but impossible,
    so utterances run to their frame budget; 3 makes early stops common (EOS paths get exercised).
    """
    from ..models.codec import CodecDecoder
    from ..models.loader import TTSModel

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    folder = Path(folder)
    (folder / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    save_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    config = make_config(kind, preset)
    codec_config = make_codec_config(preset)
    _write_json(folder / "config.json", config)
    _write_json(folder / "generation_config.json", GENERATION_CONFIG)
    _write_json(folder / "speech_tokenizer" / "config.json", codec_config)
    _write_json(folder / "speech_tokenizer" / "preprocessor_config.json", {
        "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "padding_side": "right",
        "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 24000,
        "chunk_length_s": None, "overlap": None})
    write_text_tokenizer(folder)

    cfg = load_config(folder)
    gen = torch.Generator().manual_seed(seed)
    model = TTSModel(cfg)
    _randomise(model, gen)
    talker = model.talker
    talker.codec_head.weight.mul_(HEAD_SCALE)
    talker.codec_head.weight[cfg.talker.codec_eos_token_id].mul_(eos_scale)
    for head in talker.code_predictor.lm_head:
        head.weight.mul_(HEAD_SCALE)
    tensors = {f"talker.{k}": v for k, v in talker.state_dict().items()}
    if model.speaker_encoder is not None:
        tensors.update({f"speaker_encoder.{k}": v for k, v in model.speaker_encoder.state_dict().items()})
    _save(tensors, folder / "model.safetensors", save_dtype)

    codec = CodecDecoder(cfg.codec.decoder)
    _randomise(codec, gen)
    # Keep random audio mostly inside [-1, 1] so waveform comparisons are not hidden by clipping.
    codec.decoder[-1].conv.weight.mul_(0.002)
    codec_tensors = {f"decoder.{k}": v for k, v in codec.state_dict().items()}
    codec_tensors.update({f"encoder.{k}": v for k, v in _mimi_encoder(codec_config["encoder_config"], gen).items()})
    _save(codec_tensors, folder / "speech_tokenizer" / "model.safetensors", torch.float32)
    return folder


def _mimi_encoder(encoder_config: dict, gen: torch.Generator) -> dict:
    """State dict of a random Mimi encoder half (what the official Qwen3TTSTokenizerV2Encoder keeps), under
    the published tensor names whatever layout the installed transformers gives Mimi."""
    mimi = mimi_encoder(copy.deepcopy(encoder_config))
    published = published_layout(mimi)
    _randomise(published, gen)
    return published.state_dict()


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
