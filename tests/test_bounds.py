"""Every item's cost is bounded before it runs: its frame budget, its number of pieces, the talker's
positions and the prefill's memory (issue 30: one manifest line must not take the machine down)."""

from __future__ import annotations

import json
import random
import re
import shutil
import string
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import omnitts
from omnitts.cli import app
from omnitts.engine.engine import Engine, EngineConfig, plan, prefill_bytes
from omnitts.engine.pipeline import Job, Pipeline
from omnitts.engine.preparation import prepare
from omnitts.errors import RequestError
from omnitts.params import share_frames
from omnitts.request import Request
from omnitts.text.prompt import prompt_length, resolve
from omnitts.text.split import MAX_PIECES, split_text

runner = CliRunner()
SENTENCES = "The first sentence is here. A second one follows it. Then there is a third. And a fourth closes it."


def _blob(chars: int) -> str:
    """Unbroken text: a base64-like blob, no spaces, no sentence ends."""
    rng = random.Random(chars)
    return "".join(rng.choice(string.ascii_letters + string.digits + "+/") for _ in range(chars))


def _words(chars: int) -> str:
    rng = random.Random(chars)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(chars // 4)]
    return " ".join(words)[:chars].strip()


def _split40(text, language):
    return split_text(text, max_chars=40, language=language)


def test_share_frames_adds_up_to_the_budget_in_proportion_to_the_weights():
    assert share_frames(10, [3, 3, 4]) == [3, 3, 4]
    assert share_frames(100, [1, 2, 97]) == [2, 3, 95]  # one each, then 97 more by largest remainder
    assert share_frames(5, [1] * 5) == [1] * 5
    assert share_frames(7, [0, 0]) == [4, 3]  # no weights: equal shares, the remainder to the earlier piece
    for total, weights in ((1000, [5, 17, 250, 3]), (401, [250] * 400), (13, [9, 1, 1])):
        shares = share_frames(total, weights)
        assert sum(shares) == total and min(shares) >= 1
    with pytest.raises(ValueError, match="cannot share 3 frames among 4 pieces"):
        share_frames(3, [1, 1, 1, 1])


def test_an_explicit_budget_is_the_whole_items_and_its_pieces_share_it(tts_factory):
    tts = tts_factory("custom_voice")
    pieces = _split40(SENTENCES, None)
    assert len(pieces) >= 3
    split = Pipeline(tts, split=_split40)
    jobs = [Job(Request(SENTENCES, speaker="ryan", id="frames"), tts.default_params(max_frames=9, greedy=True)),
            Job(Request(SENTENCES, speaker="ryan", id="seconds", max_seconds=1.0), tts.default_params(greedy=True))]
    outcomes = {o.job.request.id: o for o in split.run(jobs)}
    assert outcomes["frames"].pieces == len(pieces) and outcomes["frames"].result.frames == 9
    assert outcomes["seconds"].result.frames == 12  # round(1.0 s x 12.5)
    # The derived runaway budget stays per piece: each piece's from its own text.
    item, _ = prepare(Job(Request(SENTENCES, speaker="ryan"), tts.default_params()), tts, _split40, None, 0)
    budgets = [item.piece_params(i).max_frames for i in range(len(pieces))]
    assert budgets == [40 + 10 * prompt.text_tokens for _, prompt in item.pieces]


def test_a_budget_smaller_than_the_pieces_fails_that_item(tts_factory):
    tts = tts_factory("custom_voice")
    pieces = len(_split40(SENTENCES, None))
    job = Job(Request(SENTENCES, speaker="ryan", id="x"), tts.default_params(max_frames=pieces - 1, greedy=True))
    (outcome,) = Pipeline(tts, split=_split40).run([job])
    assert outcome.error == (f"max_frames: the item's budget of {pieces - 1} frames cannot be shared by its {pieces} "
                             "pieces (one frame each at least); raise the budget or split the line")
    (outcome,) = Pipeline(tts, split=_split40).run([replace(job, params=tts.default_params(max_frames=1, greedy=True))])
    assert outcome.error.startswith("max_frames: the item's budget of 1 frame cannot be shared")  # not "1 frames"


def test_too_many_pieces_is_a_line_error_in_validate_and_synth(ckpt_dir, tmp_path):
    manifest = tmp_path / "m.jsonl"
    lines = [{"id": "ok", "text": "Hello there.", "speaker": "ryan"},
             {"id": "blob", "text": _blob(100_000), "speaker": "ryan"}]
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    pieces = len(split_text(lines[1]["text"]))
    message = (f"{manifest}:2: text: 100,000 characters make {pieces:,} pieces; at most {MAX_PIECES} per item - "
               "split the line")
    checked = runner.invoke(app, ["validate", str(manifest), "-m", str(ckpt_dir("custom_voice"))])
    assert checked.exit_code == 1 and message in checked.output.splitlines()
    out = tmp_path / "out"
    ran = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                              "--greedy", "--max-frames", "4", "-q"])
    assert ran.exit_code == 1
    records = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert records["ok"]["status"] == "ok" and records["blob"]["error"] == message
    # The count follows synth's own --split-chars: 1,000-character pieces make 100, under the cap, so the
    # line passes the check (and then fails on its 4-frame budget, which 100 pieces cannot share).
    wider = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "w"),
                                "--greedy", "--max-frames", "4", "--split-chars", "1000", "-q"])
    assert wider.exit_code == 1 and "per item - split the line" not in wider.output
    # validate takes the same --split-chars (it had none, so it could not say what synth would): 100 pieces pass,
    # and 200-character pieces make more than the cap
    wide = runner.invoke(app, ["validate", str(manifest), "-m", str(ckpt_dir("custom_voice")), "--split-chars", "1000"])
    assert wide.exit_code == 0, wide.output
    narrow = runner.invoke(app, ["validate", str(manifest), "-m", str(ckpt_dir("custom_voice")), "--split-chars", "200"])
    assert narrow.exit_code == 1 and "per item - split the line" in narrow.output
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "w" / "results.jsonl").read_text().splitlines())}
    assert records["blob"]["error"].startswith("max_frames: the item's budget of 4 frames cannot be shared")


def test_a_lines_max_seconds_too_short_for_its_pieces_is_a_line_error_in_validate_and_synth(ckpt_dir, tmp_path):
    # The line's own budget and its pieces are both in the manifest: validate sees it, and synth refuses the line
    # before it runs, with the same message (it passed validate and then failed in synth).
    manifest = tmp_path / "m.jsonl"
    lines = [{"id": "ok", "text": SENTENCES, "speaker": "ryan", "max_seconds": 0.4},
             {"id": "short", "text": SENTENCES, "speaker": "ryan", "max_seconds": 0.1}]
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    pieces = len(split_text(SENTENCES, max_chars=40))
    assert pieces == 4
    message = (f"{manifest}:2: max_seconds: the item's budget of 1 frame cannot be shared by its {pieces} pieces "
               "(one frame each at least); raise the budget or split the line")
    checked = runner.invoke(app, ["validate", str(manifest), "-m", str(ckpt_dir("custom_voice")), "--split-chars", "40"])
    assert checked.exit_code == 1 and checked.output.splitlines()[0] == message
    whole = runner.invoke(app, ["validate", str(manifest), "-m", str(ckpt_dir("custom_voice")), "--split-chars", "0"])
    assert whole.exit_code == 0, whole.output  # one piece: any budget is a frame at least
    out = tmp_path / "out"
    ran = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                              "--greedy", "--split-chars", "40", "-q"])
    assert ran.exit_code == 1, ran.output  # the bad line is recorded, the good one runs
    records = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert records["ok"]["status"] == "ok" and records["short"]["error"] == message


def test_the_pipeline_caps_pieces_with_its_own_split(tts_factory):
    tts = tts_factory("custom_voice")
    text = " ".join(["Short one."] * (MAX_PIECES + 1))
    one_each = Pipeline(tts, split=lambda text, language: split_text(text, max_chars=10))
    (outcome,) = one_each.run([Job(Request(text, speaker="ryan"), tts.default_params(max_frames=999, greedy=True))])
    assert outcome.error == (f"text: {len(text):,} characters make {MAX_PIECES + 1} pieces; at most {MAX_PIECES} "
                             "per item - split the line")


def test_plan_rejects_positions_past_the_talkers_limit(tts_factory):
    ckpt = tts_factory("custom_voice").ckpt
    limit = ckpt.config.talker.max_position_embeddings
    assert limit == 32768  # the published configs' value, read from config.json
    assert plan(ckpt, limit, 1, 1, 2**40).max_positions == limit  # rounding up never passes the limit
    with pytest.raises(RequestError, match=f"need {limit + 1} talker positions, over the model's {limit}"):
        plan(ckpt, limit + 1, 1, 1, 2**40)


def test_plan_rejects_a_prompt_whose_prefill_is_over_the_budget(tts_factory):
    ckpt = tts_factory("custom_voice").ckpt
    need = prefill_bytes(ckpt.config.talker, 1, 5000, 4)
    assert plan(ckpt, 5100, 1, 1, 2**40, prompt_positions=5000, prefill_budget_bytes=need).max_prefill_bytes == need
    with pytest.raises(RequestError, match="a prompt of 5000 positions needs about .* GiB to prefill"):
        plan(ckpt, 5100, 1, 1, 2**40, prompt_positions=5000, prefill_budget_bytes=need - 1)


def test_a_prompt_too_long_for_its_instruction_names_instruct(tts_factory):
    """An instruction of some 12,000 tokens was reported as `text: a prompt of 12018 positions needs about 3.1 GiB to
    prefill, ...; split the text`, for a one-word text: the prompt is named by the field that makes most of it."""
    tts = tts_factory("voice_design")
    long = tts.prepare(Request("Hello.", instruct="very loud " * 3000))
    assert long.longest_part == "instruct" and long.instruct_tokens > 6000
    assert tts.prepare(Request("A sentence of some length, with words.", instruct="Loud.")).longest_part == "text"
    pipeline = Pipeline(tts)
    (outcome,) = pipeline.run([Job(Request("Hello.", instruct="very loud " * 3000),
                                   tts.default_params(max_frames=3, greedy=True))])
    assert outcome.error.startswith("instruct: a prompt of ") and outcome.error.endswith(
        "budget; shorten the instruction (an instruction is not split)"), outcome.error
    with pytest.raises(RequestError, match=r"^text: .*; split the text$"):
        plan(tts.ckpt, 5100, 1, 1, 2**40, prompt_positions=5000, prefill_budget_bytes=1)


def test_admission_keeps_each_prefill_within_its_memory_budget(tts_factory):
    tts = tts_factory("custom_voice")
    prompts = [tts.prepare(Request(text, speaker="ryan")) for text in ("One.", "Two words.", "Three words here.")]
    longest = max(p.embeds.shape[0] for p in prompts)
    alone = prefill_bytes(tts.ckpt.config.talker, 1, longest, 4)
    for budget, batches in ((None, [3]), (alone, [1, 1, 1])):
        engine = Engine(tts.ckpt, EngineConfig(max_num_seqs=4, max_positions=256, max_prefill_bytes=budget))
        for prompt in prompts:
            engine.add(prompt, tts.default_params(max_frames=3, greedy=True))
        admitted = []
        while engine.has_work():
            before = len(engine.scheduler.waiting)
            engine.step()
            if before != len(engine.scheduler.waiting):
                admitted.append(before - len(engine.scheduler.waiting))
        assert admitted == batches


_PEAK = """
import resource, runpy, sys
sys.argv = ["omnitts", *sys.argv[1:]]
try:
    runpy.run_module("omnitts", run_name="__main__")
except SystemExit as exc:
    code = exc.code
finally:
    print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def _synth_peak(manifest: Path, model: Path, out: Path, *flags: str) -> tuple[int, dict]:
    """Run `synth` in a fresh process; its peak resident memory (bytes) and its records by id."""
    proc = subprocess.run([sys.executable, "-c", _PEAK, "synth", str(manifest), "-m", str(model), "-o", str(out),
                           "--greedy", "--dtype", "float32", "-q", *flags], capture_output=True, text=True)
    peak = int(proc.stderr.rsplit("PEAK_KB", 1)[1].split()[0]) * 1024
    records = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    return peak, records


def test_peak_memory_of_a_100k_character_line_is_bounded(ckpt_dir, tmp_path):
    """Peak resident memory of fresh synth processes, against one that synthesizes a short line only. Before these bounds
    (with the grapheme cut already in), a 20,000-character blob with splitting off peaked at 2.5 GB on
    the tiny checkpoint (one prefill of its whole prompt), 100,000 characters took the machine down, and
    --max-frames held per piece (the 100k blob gave 300 s of audio at --max-frames 10)."""
    model = ckpt_dir("custom_voice")
    short = {"id": "short", "text": "Hello there.", "speaker": "ryan"}

    def manifest(name, *lines):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in (short, *lines)))
        return path

    base, _ = _synth_peak(manifest("base"), model, tmp_path / "base", "--max-frames", "10")
    lines = manifest("long", {"id": "blob", "text": _blob(100_000), "speaker": "ryan"},
                     {"id": "words", "text": _words(100_000), "speaker": "ryan"},
                     {"id": "shared", "text": _words(30_000), "speaker": "ryan", "max_seconds": 12})
    peak, records = _synth_peak(lines, model, tmp_path / "long", "--max-frames", "10")
    assert records["short"]["frames"] == 10
    assert "per item - split the line" in records["blob"]["error"]
    assert "per item - split the line" in records["words"]["error"]
    assert records["shared"]["pieces"] > 100 and records["shared"]["frames"] == 150  # 12 s for the whole item
    unsplit = manifest("unsplit", {"id": "blob", "text": _blob(20_000), "speaker": "ryan"})
    peak_unsplit, records = _synth_peak(unsplit, model, tmp_path / "unsplit", "--max-frames", "10",
                                        "--split-chars", "0")
    assert "GiB to prefill" in records["blob"]["error"] and records["short"]["frames"] == 10
    assert max(peak, peak_unsplit) - base < 200 * 2**20, (base, peak, peak_unsplit)


def test_numbers_past_what_the_engine_holds_are_refused_and_a_huge_budget_is_cut_to_the_cap():
    """The sampling values become float32 (top_k an int64) on the device: a larger one is a clear
    ValueError, not an overflow in the middle of a run; a budget of seconds beyond any cap is the cap."""
    from omnitts.params import SamplingParams, frames_in

    for name, value in (("repetition_penalty", 1e300), ("temperature", float("inf")), ("top_k", 2**64)):
        with pytest.raises(ValueError, match=rf"^{name}: must be at most "):
            SamplingParams(**{name: value})
    assert frames_in(1e308) == 2**31 and frames_in(1e-9) == 1 and frames_in(2.0) == 25
    params = SamplingParams(frame_cap=100)
    assert params.with_budget(10, max_seconds=1e308).max_frames == 100


def test_an_explicit_budget_past_the_frame_cap_is_cut_with_a_warning_naming_it(ckpt_dir, tmp_path):
    """A budget a piece cannot use (generation_config.json's max_new_tokens - 1 is the most one utterance takes)
    was cut to the cap without a word: `max_seconds: 1e6` gave 655 s and finish_reason `length`, as if the
    budget had run out. It is still cut, and the run says so once per budget asked, naming the field."""
    import shutil

    import omnitts

    model = tmp_path / "ckpt"
    shutil.copytree(ckpt_dir("custom_voice"), model)
    gen = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps(dict(gen, max_new_tokens=6)))  # cap: 5 frames
    lines = [{"id": "a", "text": "Hi.", "speaker": "ryan"}, {"id": "a2", "text": "Hello.", "speaker": "ryan"},
             {"id": "b", "text": "Hi.", "speaker": "ryan", "max_seconds": 1e6},
             {"id": "c", "text": "Hi.", "speaker": "ryan", "max_seconds": 0.2}]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    ran = runner.invoke(app, ["synth", str(manifest), "-m", str(model), "-o", str(out), "--greedy",
                              "--max-frames", "20", "-q"])
    assert ran.exit_code == 0, ran.output
    tail = ("is more than one utterance of this checkpoint takes: a piece stops at 5 frames (0.4 s: "
            "generation_config.json's max_new_tokens - 1), finish_reason length")
    warned = [line for line in ran.output.splitlines() if line.startswith("warning:")]
    assert warned == [f"warning: max_frames: 20 {tail}", f"warning: max_seconds: 1e+06 s {tail}"]
    records = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert {k: r["frames"] for k, r in records.items()} == {"a": 5, "a2": 5, "b": 5, "c": 2}
    tts = omnitts.load(model)
    with pytest.warns(UserWarning, match=r"^max_frames: 9 is more than one utterance"):
        assert tts.synthesize("Hi.", speaker="ryan", greedy=True, max_frames=9).frames == 5
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # within the cap: nothing to say
        assert tts.synthesize("Hi.", speaker="ryan", greedy=True, max_frames=5).frames == 5


def test_voice_clone_says_a_budget_past_the_frame_cap_in_one_warning_line(ckpt_dir, tmp_path, ref_wav):
    """voice-clone --text --max-frames past the cap: the warning is the commands' `warning:` line, not Python's
    `.../pipeline.py:NNN: UserWarning: ...` with its source line."""
    import shutil

    model = tmp_path / "ckpt"
    shutil.copytree(ckpt_dir("base"), model)
    gen = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps(dict(gen, max_new_tokens=6)))
    ran = runner.invoke(app, ["voice-clone", "-m", str(model), "--ref-audio", str(ref_wav), "--x-vector-only",
                              "--text", "Hi.", "--max-frames", "9", "--greedy", "-o", str(tmp_path / "out")])
    assert ran.exit_code == 0, ran.output
    assert "UserWarning" not in ran.output
    assert [line for line in ran.output.splitlines() if line.startswith("warning:")] == [
        "warning: max_frames: 9 is more than one utterance of this checkpoint takes: a piece stops at 5 frames (0.4 s: "
        "generation_config.json's max_new_tokens - 1), finish_reason length"]


def test_a_seed_is_a_64_bit_integer_everywhere_and_an_old_larger_one_exports_as_its_word(ckpt_dir, tts_factory,
                                                                                         tmp_path):
    """A seed past int64 was taken (its low 64 bits keyed the noise), recorded as given, and then broke what reads
    results.jsonl into int64 columns (`--export-dataset`: a traceback; Ray's metadata rows). Every way in now
    refuses it, naming the field; a record made before exports the seed's 64-bit word, which keys the same noise."""
    import datasets

    from omnitts.params import SamplingParams, check_seed
    from omnitts.sampling import seed_word

    for seed in (2**63, -(2**63) - 1, 2**70):
        with pytest.raises(ValueError, match=r"^seed: must be a 64-bit integer, from -2\*\*63 to 2\*\*63 - 1"):
            check_seed(seed)
        with pytest.raises(ValueError, match=r"^seed: must be a 64-bit integer"):
            SamplingParams(seed=seed)
    check_seed(2**63 - 1), check_seed(-(2**63))
    with pytest.raises(ValueError, match="seed: must be a 64-bit integer"):
        tts_factory("custom_voice").synthesize("Hi.", speaker="ryan", seed=2**63, max_frames=2)

    model = str(ckpt_dir("custom_voice"))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "big", "text": "Hi.", "speaker": "ryan", "seed": 2**63}) + "\n"
                        + json.dumps({"id": "ok", "text": "Hi.", "speaker": "ryan", "seed": 5}) + "\n")
    checked = runner.invoke(app, ["validate", str(manifest), "-m", model])
    assert checked.exit_code == 1 and "m.jsonl:1: seed: must be a 64-bit integer" in checked.output, checked.output
    refused = runner.invoke(app, ["synth", str(manifest), "-m", model, "-o", str(tmp_path / "x"), "--seed",
                                  str(2**63)])
    assert refused.exit_code == 2 and "--seed" in refused.output and not (tmp_path / "x").exists()

    out = tmp_path / "out"
    assert runner.invoke(app, ["synth", str(manifest), "-m", model, "-o", str(out), "--max-frames", "2",
                               "-q"]).exit_code == 1  # the bad line
    log = out / "results.jsonl"
    record = next(json.loads(line) for line in log.read_text().splitlines() if '"ok"' in line and '"id": "ok"' in line)
    log.write_text(log.read_text() + json.dumps({**record, "seed": 2**64 + 5}) + "\n")  # as an older run recorded it
    exported = runner.invoke(app, ["synth", str(manifest), "-m", model, "-o", str(out), "--max-frames", "2", "-q",
                                   "--export-dataset", str(tmp_path / "ds")])
    assert "Traceback" not in exported.output and "exported 1 item" in exported.output, exported.output
    assert datasets.load_from_disk(str(tmp_path / "ds"))["seed"] == [seed_word(2**64 + 5)] == [5]


@pytest.mark.parametrize("kind,fields", [
    ("custom_voice", dict(speaker="ryan")),
    ("custom_voice", dict(speaker="ryan", language="english", non_streaming=False)),
    ("custom_voice", dict(speaker="eric", language="chinese")),  # a dialect speaker: its dialect's tag
    ("voice_design", dict(instruct="A calm, low voice.", language="german")),
    ("voice_design", dict(instruct="A bright voice.", non_streaming=False)),
    ("base", dict(ref_text="Hello there, a reference.")),
    ("base", dict(ref_text="Hello there, a reference.", non_streaming=True, language="english")),
    ("base", dict(x_vector_only=True)),
])
def test_prompt_length_from_token_counts_is_the_built_prompts(tts_factory, ref_wav, kind, fields):
    # validate counts a prompt's positions without weights (prompt_length); it must be what the builder makes.
    tts = tts_factory(kind)
    for text in ("Hi.", SENTENCES, "一二三四五六七八九十。" * 3):
        request = Request(text, ref_audio=ref_wav if kind == "base" else None, **fields)
        voice = tts.clone_voice(ref_wav, request.ref_text, request.x_vector_only) if kind == "base" else None
        prompt = tts.prompts.build(request, voice)
        tok = tts.ckpt.tokenizer
        icl = (len(tok.reference_ids(request.ref_text)) - 5, voice.ref_codes.shape[0]) if voice and voice.icl else None
        instruct = len(tok.instruct_ids(request.instruct)) if request.instruct else 0
        assert prompt_length(resolve(tts.ckpt.config, request), prompt.text_tokens, instruct, voice is not None,
                             icl) == prompt.embeds.shape[0]


def _short_talker(ckpt, folder: Path, positions: int) -> Path:
    """A copy of checkpoint `ckpt` whose talker has only `positions` positions."""
    shutil.copytree(ckpt, folder)
    config = json.loads((folder / "config.json").read_text())
    config["talker_config"]["max_position_embeddings"] = positions
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_piece_too_long_for_the_talkers_positions_is_a_bad_line_in_validate_and_synth(ckpt_dir, tmp_path):
    # Unsplit (--split-chars 0), a long text's prompt and budget need more positions than the talker has:
    # validate said "good" and synth failed the item as it came to run. Now both call it a bad line, with the
    # engine's count, and the budget counted is synth's: the line's max_seconds, else --max-frames, else derived.
    model = _short_talker(ckpt_dir("custom_voice"), tmp_path / "ckpt", 300)
    long = " ".join(["hello world this is a test sentence."] * 20)
    manifest = tmp_path / "m.jsonl"
    lines = [{"id": "long", "text": long, "speaker": "ryan"}, {"id": "short", "text": "Hello.", "speaker": "ryan"},
             {"id": "timed", "text": long, "speaker": "ryan", "max_seconds": 16}]
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    unsplit = ["--split-chars", "0"]

    def validate(*flags):
        return runner.invoke(app, ["validate", str(manifest), "-m", str(model), *unsplit, *flags])

    derived = validate()
    assert derived.exit_code == 1 and derived.output.splitlines()[-1] == f"{manifest}: 1 good, 2 bad"
    first, timed = derived.output.splitlines()[:2]
    assert re.fullmatch(rf"{re.escape(str(manifest))}:1: text: the prompt and its frame budget need \d+ talker "
                        r"positions, over the model's 300; split the text or give it a smaller budget \(max_seconds\)",
                        first), first
    assert timed.startswith(f"{manifest}:3: ") and timed.endswith("or lower max_seconds")  # the line's budget wins
    # The positions counted are the engine's: the prompt, the frames, one more.
    prompt = omnitts.load(model, dtype="float32").prepare(Request(long, speaker="ryan"))
    room = 300 - prompt.embeds.shape[0] - 1  # the most frames that fit
    assert 0 < room < 200
    budget = validate("--max-frames", "200")
    message = budget.output.splitlines()[0]
    assert message == (f"{manifest}:1: text: the prompt and its frame budget need {prompt.embeds.shape[0] + 201} "
                       "talker positions, over the model's 300; split the text or lower --max-frames"), message
    assert validate("--max-frames", str(room + 1)).output.startswith(f"{manifest}:1: ")
    fits = validate("--max-frames", str(room))
    assert fits.output.splitlines() == [timed, f"{manifest}: 2 good, 1 bad"]
    out = tmp_path / "out"
    ran = runner.invoke(app, ["synth", str(manifest), "-m", str(model), "-o", str(out), "--greedy", "--max-frames",
                              "200", *unsplit, "-q"])
    assert ran.exit_code == 1, ran.output
    records = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert records["short"]["status"] == "ok" and records["long"]["error"] == message
    # Split (the default), each piece fits: the line is good in both.
    split = runner.invoke(app, ["validate", str(manifest), "-m", str(model), "--max-frames", "10"])
    assert split.exit_code == 0, split.output


def test_reference_frames_count_toward_the_positions_exactly_saved_or_inline(ckpt_dir, ref_wav, tmp_path):
    # A saved voice holds its reference codes: validate counts them as the engine will. An inline clip's frames
    # were counted as none ("at least 178" where the prompt needed 201): its samples, as the manifest check reads
    # them, give the frames the codec encodes exactly (resampled as load_reference resamples), so a line cloning
    # from a clip is told the engine's count, at the budget that starts not to fit, as a saved voice's line is.
    import numpy as np
    import soundfile as sf

    model = _short_talker(ckpt_dir("base"), tmp_path / "ckpt", 200)
    tts = omnitts.load(model, dtype="float32")
    ref_text = "A reference transcript of a few words."
    voice_path = tts.clone_voice(ref_wav, ref_text).save(tmp_path / "v.safetensors")
    odd = tmp_path / "odd.flac"  # 16 kHz mono, a length no frame divides
    sf.write(odd, 0.3 * np.sin(np.arange(19753) / 7.0), 16000)
    text = " ".join(["hello world this is a test sentence."] * 5)
    manifest = tmp_path / "m.jsonl"
    for ref, name in ((voice_path, "voice"), (ref_wav, "ref_audio"), (odd, "ref_audio")):
        given = {"voice": str(ref)} if name == "voice" else {"ref_audio": str(ref), "ref_text": ref_text}
        request = Request(text, voice=ref, non_streaming=True) if name == "voice" else Request(
            text, ref_audio=ref, ref_text=ref_text, non_streaming=True)
        budget = 200 - tts.prepare(request).embeds.shape[0]  # one frame too many, as the engine counts
        manifest.write_text(json.dumps({"id": "a", "text": text, "non_streaming": True, **given}) + "\n")
        over = runner.invoke(app, ["validate", str(manifest), "-m", str(model), "--split-chars", "0",
                                   "--max-frames", str(budget)])
        assert over.output.splitlines() == [
            f"{manifest}:1: text: the prompt and its frame budget need 201 talker positions, over the model's 200; "
            "split the text or lower --max-frames", f"{manifest}: 0 good, 1 bad"], (ref, over.output)
        fits = runner.invoke(app, ["validate", str(manifest), "-m", str(model), "--split-chars", "0",
                                   "--max-frames", str(budget - 1)])
        assert fits.exit_code == 0, (ref, fits.output)


def test_a_clips_frames_counted_from_its_samples_are_the_frames_the_codec_encodes(tts_factory, tmp_path):
    # validate's count (clips.reference_length -> io.audio.resampled_length -> codec_encoder.code_frames) against
    # the real path (load_reference, then the codec encoder) at rates that resample and lengths around a frame.
    import numpy as np
    import soundfile as sf

    from omnitts.batch.clips import reference_length
    from omnitts.batch.manifest import _audio_problem
    from omnitts.io.audio import load_reference, resampled_length
    from omnitts.models.codec_encoder import code_frames

    tts = tts_factory("base")
    codec = tts.ckpt.config.codec
    cases = [(24000, 1920 * 7 - 1), (24000, 1920 * 7), (24000, 1920 * 7 + 1), (22050, 26461), (16000, 8000),
             (44100, 61003), (48000, 24001), (11025, 5513), (8000, 12345), (32000, 40000)]
    for rate, samples in cases:
        for ext in ("wav", "flac", "ogg"):
            path = tmp_path / f"c{rate}-{samples}.{ext}"
            noise = np.random.default_rng(samples).standard_normal(samples) * 0.01
            sf.write(path, (0.3 * np.sin(np.arange(samples) / 5.0) + noise).astype(np.float32), rate)
            assert _audio_problem(str(path)) is None
            counted, read_rate, whole = reference_length(path)
            assert (counted, read_rate, whole) == (samples, rate, True), (path, counted)
            wav = load_reference(path, codec.input_sample_rate)
            assert len(wav) == resampled_length(samples, rate, codec.input_sample_rate), path
            encoded = tts.ckpt.codec_encoder.encode(wav).shape[0]
            assert code_frames(resampled_length(samples, rate, codec.input_sample_rate), codec) == encoded, path


def test_a_short_text_is_counted_as_the_pieces_synth_splits_it_into(ckpt_dir, tmp_path):
    # Under MAX_PIECES characters a text is not split to count its pieces; for its positions it must be: each
    # piece's derived budget is its own text's, smaller than the whole text's.
    model = _short_talker(ckpt_dir("custom_voice"), tmp_path / "ckpt", 300)
    text = "The first sentence is here and long. A second one follows it closely."
    assert len(split_text(text, max_chars=40)) == 2 and len(text) < MAX_PIECES
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "two", "text": text, "speaker": "ryan"}) + "\n")
    split = runner.invoke(app, ["validate", str(manifest), "-m", str(model), "--split-chars", "40"])
    assert split.exit_code == 0, split.output
    whole = runner.invoke(app, ["validate", str(manifest), "-m", str(model), "--split-chars", "0"])
    assert whole.exit_code == 1 and "talker positions, over the model's 300" in whole.output, whole.output
