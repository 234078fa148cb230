"""Text tokenization: the checkpoint's own regex by default, the official ids on request."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

import omnitts.text.tokenizer as tokenizer_module
from omnitts.errors import CheckpointError
from omnitts.text.tokenizer import TextTokenizer

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


def _transformers_tokenizer(folder):
    return AutoTokenizer.from_pretrained(str(folder), fix_mistral_regex=False)


def test_ids_equal_the_installed_transformers_load(folder):
    """Built with `tokenizers` alone, the tokenizer gives the ids transformers gives for the same files,
    special tokens included (whichever transformers, 4.57 or 5.x, is installed)."""
    tokenizer_module._LOADED.clear()
    ours, again = TextTokenizer(folder), TextTokenizer(folder)  # the second reuses this process's build
    direct = _transformers_tokenizer(folder)
    for text in TRICKY + ["<|im_start|>assistant\nHi<|im_end|>\n", "<tts_pad><tts_text_bos>x<think>"]:
        expected = direct(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == again.encode(text) == expected


def test_a_first_load_imports_no_transformers(folder):
    """The published files become the same fast tokenizer transformers converts them to (every part that
    decides ids), built in a fresh process that never imports transformers."""
    import json
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "import omnitts.text.tokenizer as t\n"
        f"t.TextTokenizer({str(folder)!r})\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'sklearn'))))\n"
        f"print(t._LOADED.popitem()[1])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    imported, built = out.split("\n", 1)
    assert json.loads(imported) == []
    ours = json.loads(built)
    theirs = json.loads(_transformers_tokenizer(folder).backend_tokenizer.to_str())
    # transformers 5 swapped the post-processor for an empty template; with add_special_tokens=False
    # neither adds or changes ids, so it is not compared.
    for part in ("model", "normalizer", "pre_tokenizer", "decoder", "added_tokens"):
        assert ours[part] == theirs[part], part


def _copy_files(folder, tmp_path):
    import shutil

    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(folder / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("damage, message", [
    (lambda c: c.update(tokenizer_class="LlamaTokenizer"), "tokenizer_class 'LlamaTokenizer' is not supported"),
    (lambda c: c["added_tokens_decoder"].update({"151999": {"content": "<x>"}}), "added token '<x>' has id 151999"),
    (lambda c: c.update(added_tokens_decoder=[1, 2]), "added_tokens_decoder is malformed"),
])
def test_tokenizer_config_errors_name_the_file(folder, tmp_path, damage, message):
    import json

    copy = _copy_files(folder, tmp_path)
    config = json.loads((copy / "tokenizer_config.json").read_text(encoding="utf-8"))
    damage(config)
    (copy / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(CheckpointError, match=message) as info:
        TextTokenizer(copy)
    assert "tokenizer_config.json" in str(info.value)


def test_a_missing_tokenizer_config_is_named_not_spelled_out(folder, tmp_path):
    """tokenizer_config.json defines <|im_start|> and <|im_end|>: without it every prompt's markers became BPE pieces
    (27, 91, 399...) and the checkpoint loaded and ran on garbled prompts."""
    copy = _copy_files(folder, tmp_path)
    (copy / "tokenizer_config.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: file not found; it defines the tokens <\|im_start"):
        TextTokenizer(copy)


def test_a_tokenizer_file_without_the_chat_tokens_is_named(folder, tmp_path):
    import json

    copy = _copy_files(folder, tmp_path)
    config = json.loads((copy / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["added_tokens_decoder"] = {}
    (copy / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: defines no token <\|im_start\|>"):
        TextTokenizer(copy)
    document = json.loads(TextTokenizer(folder)._tok.to_str())  # a shipped tokenizer.json without them, too
    document["added_tokens"] = [t for t in document["added_tokens"] if t["content"] != "<|im_end|>"]
    (copy / "tokenizer.json").write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: defines no token <\|im_end\|>"):
        TextTokenizer(copy)


def test_a_missing_merges_file_is_named(folder, tmp_path):
    """Was "cannot read the text tokenizer files (FileNotFoundError: [Errno 2] No such file or directory: ...)"."""
    copy = _copy_files(folder, tmp_path)
    (copy / "merges.txt").unlink()
    with pytest.raises(CheckpointError) as caught:
        TextTokenizer(copy)
    assert str(caught.value) == (f"{copy / 'merges.txt'}: file not found (the text tokenizer is vocab.json + "
                                 "merges.txt, or tokenizer.json)")


@pytest.mark.parametrize("name, data", [("tokenizer_config.json", b"{bad"), ("vocab.json", b"garbage"),
                                        ("merges.txt", b"a b\n\xff c\n")])
def test_an_unreadable_tokenizer_file_is_named(folder, tmp_path, name, data):
    """Was "CKPT: cannot read the text tokenizer files (JSONDecodeError: ...)", naming none of the three."""
    copy = _copy_files(folder, tmp_path)
    (copy / name).write_bytes(data)
    with pytest.raises(CheckpointError) as caught:
        TextTokenizer(copy)
    assert str(caught.value).startswith(f"{copy / name}: cannot read this text tokenizer file ("), caught.value


def test_a_malformed_merges_line_is_named(folder, tmp_path):
    copy = _copy_files(folder, tmp_path)
    lines = (copy / "merges.txt").read_text(encoding="utf-8").splitlines()
    lines[4] = "a b c"
    (copy / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"merges\.txt:5: expected two symbols"):
        TextTokenizer(copy)


def test_a_merge_of_unknown_symbols_is_named(folder, tmp_path):
    copy = _copy_files(folder, tmp_path)
    with (copy / "merges.txt").open("a", encoding="utf-8") as merges:
        merges.write("\u4e00\u4e01 \u4e02\n")
    with pytest.raises(CheckpointError, match="vocab.json and merges.txt do not make a BPE tokenizer"):
        TextTokenizer(copy)


def test_a_malformed_tokenizer_json_is_named(folder, tmp_path):
    copy = _copy_files(folder, tmp_path)
    (copy / "tokenizer.json").write_text('{"model": 3}', encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: not a tokenizers document"):
        TextTokenizer(copy)


def test_a_shipped_tokenizer_json_is_used_as_is(folder, tmp_path):
    copy = _copy_files(folder, tmp_path)
    (copy / "tokenizer.json").write_text(TextTokenizer(folder)._tok.to_str(), encoding="utf-8")
    (copy / "merges.txt").write_text("not read\n", encoding="utf-8")
    assert TextTokenizer(copy).encode(TRICKY[0]) == TextTokenizer(folder).encode(TRICKY[0])


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
