"""Prompt construction: a request becomes the talker's prefill embeddings and its trailing text.

A prompt is a sequence of embeddings, not token ids. Per position it sums a text-side embedding
(projected text tokens, or the special tts_pad / tts_bos / tts_eos) and a codec-side embedding
(think / language / speaker tags, codec pad / bos, or reference codes), exactly as the official
`generate` assembles it:

    [instruction]  <|im_start|>assistant\\n  tags(+speaker)  first-text-token  | trailing text ...

In non-streaming text mode the whole text sits in the prefill and the trailing text is just tts_pad;
in streaming mode one text token joins each generated frame. Voice cloning (ICL) appends the
reference text and the reference codes; the reference audio is cut off after decoding.

The official code projects token slices in particular groupings ([:3], [3:4], [3:-5], [4:-5], and
the three specials together); we keep those groupings so the float results are bitwise identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import RequestError
from ..io import url_problem
from ..request import Request, Voice
from . import empty_text, lone_surrogate, no_transcript


@dataclass
class Prompt:
    embeds: torch.Tensor  # (L, hidden) prefill
    trailing: torch.Tensor  # (T, hidden) text added to frame k's input while k < T
    pad: torch.Tensor  # (hidden,) tts_pad, added once the trailing text is used up
    ref_codes: torch.Tensor | None  # (R, 16) prepended at decode time and cut from the audio (ICL)
    text_tokens: int = 0  # tokens of the text to speak (sizes the runaway guard)
    instruct_tokens: int = 0  # tokens of the instruction (0: none); a prompt too long for them names instruct

    @property
    def longest_part(self) -> str:
        """The request field that makes most of the prompt (`longest_part`)."""
        return longest_part(self.text_tokens, self.instruct_tokens)


def longest_part(text_tokens: int, instruct_tokens: int) -> str:
    """The request field that makes most of a prompt, to name when the prompt is too long: "text" (split it) or
    "instruct" (an instruction is never split)."""
    return "instruct" if instruct_tokens > text_tokens else "text"


def shorten(part: str) -> str:
    """How to shorten a prompt that `part` (`longest_part`) makes most of."""
    return "split the text" if part == "text" else "shorten the instruction (an instruction is not split)"


def positions_problem(part: str, positions, limit: int, budget: str = "lower max_frames", piece: str = "") -> str:
    """What to say of a prompt whose prompt and frame budget need `positions` talker positions (a count, or "at
    least N"), over the model's `limit`: `part` as `longest_part`, `budget` how to lower the frame budget, `piece`
    which piece of a split text ("piece 2 of 3: ")."""
    return (f"{part}: {piece}the prompt and its frame budget need {positions} talker positions, over the model's "
            f"{limit}; {shorten(part)} or {budget}")


@dataclass
class Resolved:
    """A request checked against the checkpoint, with names turned into ids."""

    language_id: int | None  # None = auto
    speaker_id: int | None
    instruct: str | None
    non_streaming: bool


def not_text(value: str) -> str | None:
    """What makes `value` no text (None: nothing): a lone surrogate, which no encoding can write and no
    tokenizer reads (a JSON escape such as "\\ud800" without its pair makes one)."""
    at = lone_surrogate(value)
    if at is None:
        return None
    return (f"a lone surrogate {value[at]!r} at character {at + 1} is not text (write the character itself, or "
            "both halves of its surrogate pair)")


def _speaker_choice(tcfg) -> str:
    """What to choose from, for a speaker error: the checkpoint's speakers, or that it has none."""
    if not tcfg.speakers:
        return "it names no speakers (talker_config.spk_id in its config.json is empty)"
    return f"choose one of {', '.join(tcfg.speakers)}"


REFERENCE_PATHS = (("ref_audio", "a reference clip"), ("voice", "a saved .safetensors voice"))


def check_reference_paths(field) -> None:
    """RequestError naming the field if `field(name)`, for ref_audio and voice, is a string of no path: an
    empty one would be read as the current folder (or a manifest's), a URL as a file beside the manifest."""
    for name, what in REFERENCE_PATHS:
        value = field(name)
        if isinstance(value, str) and not value.strip():
            raise RequestError(f"{name}: empty; give the path of {what}")
        if problem := url_problem(value):
            raise RequestError(f"{name}: {problem}")


def resolve(cfg, req: Request) -> Resolved:
    """Check `req` against what checkpoint config `cfg` can do; raise RequestError naming the field."""
    tcfg, kind = cfg.talker, cfg.model_type
    if not isinstance(req.text, str):  # apart from the next check, which sets `problem` only for a string
        raise RequestError(f"text: {'missing' if req.text is None else 'expected a string, got ' + type(req.text).__name__}"
                           "; give the words to speak")
    if problem := empty_text(req.text):
        raise RequestError(f"text: {problem}; give the words to speak")
    for name in ("text", "instruct", "ref_text"):
        value = getattr(req, name)
        if isinstance(value, str) and (problem := not_text(value)):
            raise RequestError(f"{name}: {problem}")
    check_reference_paths(lambda name: getattr(req, name))
    language = (req.language or "auto").lower()
    if not tcfg.knows_language(language):
        raise RequestError(f"language: {req.language!r} is not known to this checkpoint; "
                           f"choose one of {', '.join(tcfg.languages)}")
    language_id = None if language == "auto" else tcfg.codec_language_id[language]
    speaker_id = None
    has_ref = req.voice is not None or req.ref_audio is not None
    has_ref_text = not no_transcript(req.ref_text)
    if kind != "base" and (has_ref or has_ref_text or req.x_vector_only):  # a cloning field would do nothing here;
        # said first: a voice given to a CustomVoice checkpoint is the line's mistake, not its missing speaker
        name = ("voice" if req.voice is not None else "ref_audio" if has_ref else "ref_text" if has_ref_text
                else "x_vector_only")
        raise RequestError(f"{name}: voice cloning needs a Base checkpoint; this one is {kind}")
    if kind == "custom_voice":
        if not req.speaker:
            raise RequestError(f"speaker: required by this CustomVoice checkpoint; {_speaker_choice(tcfg)}")
        speaker = req.speaker.lower()
        if speaker not in tcfg.spk_id:
            raise RequestError(f"speaker: {req.speaker!r} is not known to this checkpoint; {_speaker_choice(tcfg)}")
        speaker_id = tcfg.spk_id[speaker]
        dialect = tcfg.spk_is_dialect.get(speaker) or None
        if dialect and language in ("chinese", "auto"):
            language_id = tcfg.codec_language_id[dialect]  # official: dialect speakers speak their dialect
    elif req.speaker:
        raise RequestError(f"speaker: this {kind} checkpoint has no preset speakers "
                           f"(preset speakers need a CustomVoice checkpoint)")
    if req.instruct and not cfg.accepts_instruct:
        why = ("0.6B CustomVoice checkpoints take no instruction" if kind == "custom_voice"
               else "Base checkpoints take no instruction; describe voices with a VoiceDesign checkpoint")
        raise RequestError(f"instruct: {why}")
    if kind == "base":
        if not has_ref:
            raise RequestError("ref_audio: this Base checkpoint clones a voice; give ref_audio (+ ref_text) or a voice")
        if req.voice is not None and req.ref_audio is None and has_ref_text:
            raise RequestError("ref_text: a saved voice keeps the mode and transcript it was saved with; remove "
                               "ref_text (or clone from ref_audio)")
        if req.voice is not None and req.ref_audio is None and req.x_vector_only:  # as a manifest line's is read
            from ..voice import mode_conflict, voice_mode

            named = "the voice" if isinstance(req.voice, Voice) else f"voice {req.voice}"
            if problem := mode_conflict(True, voice_mode(req.voice), named):
                raise RequestError(problem)
        if req.voice is None and not req.x_vector_only and not has_ref_text:
            raise RequestError("ref_text: required for in-context cloning; give the reference transcript "
                               "or set x_vector_only")
    non_streaming = req.non_streaming if req.non_streaming is not None else kind != "base"
    return Resolved(language_id, speaker_id, req.instruct or None, non_streaming)


def prompt_length(r: Resolved, text_tokens: int, instruct_tokens: int = 0, voice: bool = False,
                  icl: tuple[int, int] | None = None) -> int:
    """The prefill length `PromptBuilder.build` gives (its `embeds.shape[0]`), from token counts alone: no
    weights needed, so validate can tell a prompt too long for the talker. `text_tokens`: the text's
    (`Prompt.text_tokens`); `instruct_tokens`: `len(instruct_ids(...))` (0: none); `voice`: a cloned voice
    (its x-vector takes the speaker's place); `icl`: (reference text tokens, reference frames) of in-context
    cloning (`len(reference_ids(ref_text)) - 5`, `ref_codes.shape[0]`)."""
    tags = 3 if r.language_id is None else 4
    codec = tags + (r.speaker_id is not None or voice) + 2  # tags, [speaker], pad, bos
    head = instruct_tokens + 3 + codec - 1  # [instruction], <|im_start|>assistant\n, the codec side but bos
    if icl is not None:
        ref_tokens, ref_frames = icl
        n_text, n_codec = ref_tokens + text_tokens + 1, ref_frames + 1
        return head + (n_text + n_codec if r.non_streaming else n_codec)
    return head + (text_tokens + 2 if r.non_streaming else 1)


class PromptBuilder:
    """Turns requests into talker prompts for one loaded checkpoint.

    Prompts are built between engine steps, while the device runs the frame launched last: token ids
    are made on the host and reach the device through `upload` (the device layer's uploader: pinned and
    non_blocking on accelerators), never by `torch.tensor(..., device=)` or `.to(device)`, which would
    make the host wait for that frame.
    """

    def __init__(self, ckpt, upload=None):
        self.ckpt = ckpt
        self.cfg = ckpt.config
        self.talker = ckpt.model.talker
        if upload is None:
            from ..device.copies import uploader

            upload = uploader(ckpt.device)
        self.upload = upload

    @torch.inference_mode()
    def build(self, req: Request, voice: Voice | None = None) -> Prompt:
        """Embeddings for `req`; Base requests need their `voice` (already encoded)."""
        r = resolve(self.cfg, req)
        cfg, tcfg, talker, tok = self.cfg, self.cfg.talker, self.talker, self.ckpt.tokenizer
        ids = lambda values: self.upload(torch.tensor([values], dtype=torch.long))  # noqa: E731 (1, n)
        text_ids = ids(tok.assistant_ids(req.text))
        if text_ids.shape[1] < 9:
            raise RequestError("text: tokenizer produced no tokens for the text")
        tts_bos, tts_eos, tts_pad = talker.embed_text(
            ids([cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id])).chunk(3, dim=1)

        if r.language_id is None:
            tags = [tcfg.codec_nothink_id, tcfg.codec_think_bos_id, tcfg.codec_think_eos_id]
        else:
            tags = [tcfg.codec_think_id, tcfg.codec_think_bos_id, r.language_id, tcfg.codec_think_eos_id]
        codec = [talker.embed_codec(ids(tags))]
        if r.speaker_id is not None:
            codec.append(talker.embed_codec(ids([r.speaker_id])))
        elif voice is not None:
            codec.append(self.upload(voice.x_vector).to(tts_pad.dtype).view(1, 1, -1))
        codec.append(talker.embed_codec(ids([tcfg.codec_pad_id, tcfg.codec_bos_id])))
        codec = torch.cat(codec, dim=1)  # (1, n, D): tags, [speaker], pad, bos

        role = talker.embed_text(text_ids[:, :3])  # <|im_start|>assistant\n
        text_side = torch.cat((tts_pad.expand(-1, codec.shape[1] - 2, -1), tts_bos), dim=1)
        parts = [role, text_side + codec[:, :-1]]
        instruct = tok.instruct_ids(r.instruct) if r.instruct else []
        if instruct:
            parts.insert(0, talker.embed_text(ids(instruct)))

        if voice is not None and voice.icl:
            icl, trailing = self._icl(text_ids, voice, tts_eos, tts_pad, r.non_streaming)
            parts.append(icl)
        elif r.non_streaming:
            body = torch.cat((talker.embed_text(text_ids[:, 3:-5]), tts_eos), dim=1)
            body = body + talker.embed_codec(ids([tcfg.codec_pad_id] * body.shape[1]))
            parts += [body, tts_pad + talker.embed_codec(ids([tcfg.codec_bos_id]))]
            trailing = tts_pad
        else:
            parts.append(talker.embed_text(text_ids[:, 3:4]) + codec[:, -1:])
            trailing = torch.cat((talker.embed_text(text_ids[:, 4:-5]), tts_eos), dim=1)
        embeds = torch.cat(parts, dim=1)
        ref_codes = voice.ref_codes if voice is not None and voice.icl else None
        return Prompt(embeds[0], trailing[0], tts_pad[0, 0], ref_codes, text_ids.shape[1] - 8, len(instruct))

    def _icl(self, text_ids, voice: Voice, tts_eos, tts_pad, non_streaming: bool):
        """In-context cloning: reference text + target text against bos + reference codes."""
        talker, tcfg, upload = self.talker, self.cfg.talker, self.upload
        ref_ids = upload(torch.tensor([self.ckpt.tokenizer.reference_ids(voice.ref_text or "")]))
        text = talker.embed_text(torch.cat([ref_ids[:, 3:-2], text_ids[:, 3:-5]], dim=-1))
        text = torch.cat([text, tts_eos], dim=1)  # (1, T1, D)
        codes = upload(voice.ref_codes)
        codec = talker.embed_frame(codes).unsqueeze(0)  # (1, R, D)
        bos = talker.embed_codec(upload(torch.tensor([[tcfg.codec_bos_id]])))
        codec = torch.cat([bos, codec], dim=1)  # (1, R + 1, D)
        n_text, n_codec = text.shape[1], codec.shape[1]
        if non_streaming:
            pads = talker.embed_codec(upload(torch.tensor([[tcfg.codec_pad_id] * n_text])))
            return torch.cat([text + pads, codec + tts_pad], dim=1), tts_pad
        if n_text > n_codec:
            return text[:, :n_codec] + codec, text[:, n_codec:]
        text = torch.cat([text] + [tts_pad] * (n_codec - n_text), dim=1)
        return text + codec, tts_pad
