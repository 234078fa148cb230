"""A manifest's good line checked against one checkpoint, before anything loads: what synth would refuse.

`LineChecker.check` raises RequestError naming the field where a line asks what the checkpoint cannot do
(a speaker, a language, a mode: `resolve`), makes more pieces than an item may, gives a `max_seconds` too
short for its pieces, names a saved voice that is not this checkpoint's, or has a piece whose prompt and
frame budget need more talker positions than the model has. validate and synth's pass 1 (and the Ray
stage) run the same checks, so they agree on what a bad line is.

It reads configs, saved voices and, only for a piece long enough to be in doubt, the text tokenizer; an inline
clip's frames come from the samples the manifest check read of it. It never loads weights. It does not parse
lines (manifest.py) or know the device's memory (the engine plans that when it runs).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import RequestError
from ..params import SamplingParams, frames_in, share_frames, share_problem
from ..text import no_transcript
from ..text.prompt import longest_part, positions_problem, prompt_length, resolve
from ..text.split import MAX_PIECES, pieces_problem, split_text
from .clips import reference_length


def _placeholder_voice():
    import torch

    from ..request import Voice

    return Voice(x_vector=torch.zeros(0), ref_codes=None, ref_text=None)


class Voices:
    """Saved voices checked against one checkpoint (`cfg.path`): as `TTS.load_voice` will check them
    (format, checkpoint identity, shapes), without loading the model. The identity is computed once
    (it reads the speaker and codec encoders' weights), each voice file is read once."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.identity: str | None = None
        self.problems: dict[str, str | None] = {}  # resolved voice path -> its problem (None: fits)
        self.references: dict[str, tuple[str, int] | None] = {}  # resolved path -> (ref_text, frames); None: x-vector

    def problem(self, path: Path) -> str | None:
        key = str(Path(path).resolve())
        if key not in self.problems:
            self.problems[key] = self._check(path, key)
        return self.problems[key]

    def reference(self, path: Path) -> tuple[str, int] | None:
        """A fitting voice's in-context reference: (its transcript, its frames); None for an x-vector voice."""
        return self.references.get(str(Path(path).resolve()))

    def _check(self, path: Path, key: str) -> str | None:
        from ..errors import CheckpointError, VoiceError
        from ..voice import check_voice, checkpoint_identity, load_voice

        try:
            if self.identity is None:
                self.identity = checkpoint_identity(self.cfg.path)
            voice, meta = load_voice(path)
            check_voice(voice, meta, path, self.identity, self.cfg)
        except CheckpointError as exc:
            return f"cannot check it against the checkpoint: {exc}"
        except VoiceError as exc:
            return str(exc)
        self.references[key] = (voice.ref_text, voice.ref_codes.shape[0]) if voice.icl else None
        return None


class LineChecker:
    """The checks of one run's lines against checkpoint config `cfg` (`omnitts.config.load_config`).

    `split_chars`: synth's `--split-chars` (None the default, 0 never), which sets the pieces a text makes;
    `max_frames`: its `--max-frames` (the budget of lines without `max_seconds`; None derives one per piece);
    `official_tokenizer`: its `--official-tokenizer` (how the text tokenizer counts). A `cfg` without a path
    (a config alone) checks no saved voice and no talker positions.
    """

    def __init__(self, cfg, split_chars: int | None = None, max_frames: int | None = None,
                 official_tokenizer: bool = False):
        self.cfg, self.split_chars, self.max_frames = cfg, split_chars, max_frames
        self.official_tokenizer = official_tokenizer
        self.voices = Voices(cfg) if cfg.path is not None else None
        self.params = SamplingParams.from_generation_config(cfg.generation)  # the budgets' rules and frame cap
        self._tokenizer = None

    def check(self, item) -> None:
        """RequestError naming the field if synth would refuse manifest item `item` (`manifest.Item`)."""
        cfg, request = self.cfg, item.request
        reference = None  # a saved voice's (ref_text, frames) for in-context cloning
        if item.voice_path is not None:
            if cfg.model_type != "base":
                raise RequestError(f"voice: a saved voice needs a Base checkpoint; this one is {cfg.model_type}")
            if self.voices is not None:
                if problem := self.voices.problem(item.voice_path):
                    raise RequestError(f"voice: {problem}")
                reference = self.voices.reference(item.voice_path)
            request = replace(request, voice=_placeholder_voice())  # resolve only asks whether there is one
        resolved = resolve(cfg, request)
        text, pieces = request.text, None
        # A piece has a character at least: a text of at most MAX_PIECES characters makes no more pieces.
        if self.split_chars != 0 and (len(text) > MAX_PIECES or request.max_seconds is not None):
            pieces = self._pieces(request)
            problem = pieces_problem(text, len(pieces)) or (  # the line's own budget wins over --max-frames
                request.max_seconds is not None
                and share_problem("max_seconds", frames_in(request.max_seconds), len(pieces)))
            if problem:
                raise RequestError(problem)
        if cfg.path is not None:
            self._check_positions(item, request, resolved, pieces, reference)

    def _pieces(self, request) -> list[str]:
        """The texts `request` runs as, split as synth splits it (`Settings.splitter`)."""
        if self.split_chars == 0:
            return [request.text]
        return split_text(request.text, max_chars=self.split_chars, language=request.language) or [request.text]

    def _check_positions(self, item, request, resolved, pieces: list[str] | None, reference) -> None:
        """RequestError if a piece's prompt and frame budget need more talker positions than the model has, as
        the engine would say when the piece came to run (`pieces`: the request's, None where not split yet).
        Only a line long enough to be in doubt is split and tokenized: a token is a UTF-8 byte at least, four
        per character at most, and no piece is longer than its text. An inline reference clip's frames are
        counted from the samples the manifest check read (`_clip_frames`), exactly as the codec will encode it."""
        limit = self.cfg.talker.max_position_embeddings
        voice = item.voice_path is not None or request.ref_audio is not None  # a Base line (resolve saw one)
        icl = reference is not None or (item.voice_path is None and voice and not request.x_vector_only)
        ref_text = reference[0] if reference is not None else request.ref_text
        ref_frames, exact = reference[1] if reference is not None else 0, True
        if icl and reference is None:  # an inline clip, to be encoded as the line runs
            ref_frames, exact = self._clip_frames(Path(request.ref_audio))
        instruct = request.instruct or ""
        explicit = frames_in(request.max_seconds) if request.max_seconds is not None else self.max_frames
        cap = self.params.frame_cap
        budget = cap if explicit is None else min(explicit, cap)  # the most frames a piece may get

        def need(text_tokens, instruct_tokens, ref_tokens, frames) -> int:
            return prompt_length(resolved, text_tokens, instruct_tokens, voice,
                                 (ref_tokens, ref_frames) if icl else None) + frames + 1

        ref_chars = len(ref_text) if icl and not no_transcript(ref_text) else 0
        if need(4 * len(request.text), 4 * len(instruct), 4 * ref_chars, budget) <= limit:
            return
        pieces = pieces or self._pieces(request)
        if explicit is not None and explicit < len(pieces):
            return  # --max-frames too small to share: the item fails for that as it runs (jobs.budget_shares)
        tok = self._text_tokenizer()
        text_tokens = [len(tok.assistant_ids(p)) - 8 for p in pieces]
        instruct_tokens = len(tok.instruct_ids(instruct)) if instruct else 0
        ref_tokens = len(tok.reference_ids(ref_text or "")) - 5 if icl else 0
        # Each piece's budget as the run gives it (jobs.JobState.piece_params): its share of an explicit one, else
        # the line's max_seconds, else --max-frames, else the runaway guard; at most the frame cap
        params = replace(self.params, max_frames=None if request.max_seconds is not None else self.max_frames)
        shares = share_frames(explicit, text_tokens) if explicit is not None and len(pieces) > 1 else None
        for index, tokens in enumerate(text_tokens):
            share = params if shares is None else replace(params, max_frames=shares[index])
            frames = share.with_budget(tokens, request.max_seconds).max_frames
            positions = need(tokens, instruct_tokens, ref_tokens, frames)
            if positions <= limit:
                continue
            lower = ("lower max_seconds" if request.max_seconds is not None else "lower --max-frames"
                     if explicit is not None else "give it a smaller budget (max_seconds)")
            piece = f"piece {index + 1} of {len(pieces)}: " if len(pieces) > 1 else ""
            at_least = "" if exact else "at least "  # more of the clip's frames come on top
            raise RequestError(positions_problem(longest_part(tokens, instruct_tokens), f"{at_least}{positions}",
                                                 limit, lower, piece))

    def _clip_frames(self, path: Path) -> tuple[int, bool]:
        """(the reference frames clip `path` encodes to, whether that is exact): its samples as synthesis reads
        them (`clips.reference_length`: counted by the manifest check's read of it, no second read),
        resampled to the codec's rate as `load_reference` resamples them, one frame per hop begun
        (`code_frames`). (0, False) for a clip that cannot be read now (the run says what is wrong with it)."""
        from ..io.audio import resampled_length
        from ..models.codec_encoder import code_frames

        length = reference_length(path)
        if length is None:
            return 0, False
        samples, rate, whole = length
        codec = self.cfg.codec
        return code_frames(resampled_length(samples, rate, codec.input_sample_rate), codec), whole

    def _text_tokenizer(self):
        if self._tokenizer is None:
            from ..text.tokenizer import TextTokenizer

            self._tokenizer = TextTokenizer(self.cfg.path, official_regex=self.official_tokenizer)
        return self._tokenizer
