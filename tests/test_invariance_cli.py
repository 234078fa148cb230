"""Through the command, as a user runs it: a mixed manifest of every checkpoint kind gives the same codes at
--max-batch 1, 6 and 32, greedy and seeded, in bfloat16 (what `--dtype auto` is on a bf16 CPU) and float32.
The engine-level test (test_invariance.py) checks hidden states and logits bitwise; this one checks that
nothing between the manifest and the files (splitting, scheduling, prefill, the codec) undoes it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from omnitts.cli import app

TEXTS = [("english", "Hello there, how are you today?"), ("chinese", "今天天气很好。"),
         ("french", "Bonjour, comment allez-vous ?"), ("auto", "Two words."),
         ("english", "A somewhat longer line, so that rows of other lengths share the batch with it.")]


def _rows(kind: str, ref_wav) -> list[dict]:
    rows = []
    for i, (language, text) in enumerate(TEXTS):
        row = {"id": f"{kind}-{i}", "text": text, "language": language, "seed": 100 + i}
        if kind == "custom_voice":
            row["speaker"] = "ryan"
            if i % 2:
                row["instruct"] = "Calm and slow."
        elif kind == "voice_design":
            row["instruct"] = "A bright young voice." if i % 2 else "A warm, low voice."
        else:  # base: in-context cloning and the speaker embedding alone
            row["ref_audio"] = str(ref_wav)
            if i % 2:
                row["x_vector_only"] = True
            else:
                row["ref_text"] = "Reference words."
        rows.append(row)
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("kind", ["custom_voice", "voice_design", "base"])
def test_codes_do_not_depend_on_max_batch(ckpt_dir, tmp_path, ref_wav, kind, dtype):
    manifest = tmp_path / "m.jsonl"
    rows = _rows(kind, ref_wav)
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    ckpt = ckpt_dir(kind, "tiny-1.7b" if kind == "custom_voice" else "tiny-0.6b")  # 1.7B CustomVoice takes instruct
    for sampling in (["--greedy"], ["--no-greedy"]):
        codes = {}
        for batch in (1, 6, 32):
            out = tmp_path / f"{sampling[0].strip('-')}-{batch}"
            result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(ckpt), "-o", str(out), "--dtype", dtype,
                                              "--max-batch", str(batch), "--max-frames", "12", "--save-codes", "-q",
                                              *sampling])
            assert result.exit_code == 0, result.output
            codes[batch] = {r["id"]: np.load(out / f"{r['id']}.codes.npy") for r in rows}
        for batch in (6, 32):
            for r in rows:
                assert np.array_equal(codes[1][r["id"]], codes[batch][r["id"]]), (sampling, batch, r["id"])
