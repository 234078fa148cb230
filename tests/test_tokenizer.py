"""Text tokenization: the checkpoint's own regex by default, the official ids on request."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

import omnitts.tokenizer as tokenizer_module
from omnitts.tokenizer import TextTokenizer

TRICKY = [
    "iPhone and JavaScript users can't stop; I'm sure they'll agree.",
    "CamelCaseWords like McDonald, OpenAI and HTTPServer.",
    "Numbers: 2024, 3.14159 and 1,000,000.",
    "中文测试：你好，世界！今天是2024年。",
    "  leading spaces, trailing newline\n",
]


@pytest.fixture(scope="module")
def folder(ckpt_dir):
    return ckpt_dir("custom_voice")


def test_native_ids_equal_a_fresh_transformers_load(folder, tmp_path, monkeypatch):
    """The converted-and-cached tokenizer tokenizes exactly like loading the checkpoint files directly."""
    monkeypatch.setenv("OMNITTS_CACHE_DIR", str(tmp_path))
    tokenizer_module._LOADED.clear()
    first = TextTokenizer(folder)  # converts and writes the cache
    tokenizer_module._LOADED.clear()
    cached = TextTokenizer(folder)  # reads tokenizer.json from the cache
    assert list(tmp_path.glob("tokenizers/*/tokenizer.json"))
    direct = AutoTokenizer.from_pretrained(str(folder), fix_mistral_regex=False)
    for text in TRICKY:
        expected = direct(text, add_special_tokens=False)["input_ids"]
        assert first.encode(text) == cached.encode(text) == expected


def test_first_conversion_skips_the_generation_stack(folder, tmp_path):
    """A first load (empty cache) converts through Qwen2's own class: the same tokenizer.json as
    AutoTokenizer's, without importing transformers' generation stack or scikit-learn."""
    import json
    import os
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from omnitts.tokenizer import TextTokenizer\n"
        f"TextTokenizer({str(folder)!r})\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('sklearn', 'transformers.generation')))))\n"
    )
    env = {**os.environ, "OMNITTS_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    converted = next(tmp_path.glob("tokenizers/*/tokenizer.json")).read_text(encoding="utf-8")
    auto = AutoTokenizer.from_pretrained(str(folder), fix_mistral_regex=False).backend_tokenizer.to_str()
    assert json.loads(converted) == json.loads(auto)


def test_prompt_wrappers_keep_role_and_tail_tokens_separate(folder):
    tok = TextTokenizer(folder)
    head = tok.encode("<|im_start|>assistant\n")
    tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n")
    assert len(head) == 3 and len(tail) == 5
    for text in TRICKY:
        ids = tok.assistant_ids(text)
        assert ids[:3] == head and ids[-5:] == tail
        assert tok.reference_ids(text)[-2:] == tail[:2]


def test_official_regex_changes_camel_case_only(folder):
    native, official = TextTokenizer(folder), TextTokenizer(folder, official_regex=True)
    assert native.encode("iPhone JavaScript") != official.encode("iPhone JavaScript")
    assert native.encode("中文测试：你好，世界！") == official.encode("中文测试：你好，世界！")
    # The switch must not leak into other tokenizers of the same checkpoint (they share a cache).
    assert TextTokenizer(folder).encode("iPhone JavaScript") == native.encode("iPhone JavaScript")
