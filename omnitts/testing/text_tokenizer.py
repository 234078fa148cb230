"""The text-tokenizer files of a random Qwen3-TTS-12Hz checkpoint, in the published layout.

This module owns four top-level files of a test checkpoint: `vocab.json`, `merges.txt`,
`tokenizer_config.json` and `preprocessor_config.json`. The published Qwen3-TTS-12Hz repositories
(all five models ship the same four files) carry exactly these and no `tokenizer.json`,
`special_tokens_map.json` or chat template, so transformers builds the Qwen2 byte-level BPE itself
from vocab.json + merges.txt, with the genuine Qwen2 pre-tokenizer regex.
`preprocessor_config.json` is what names `Qwen3TTSProcessor` for `AutoProcessor`.

`tokenizer_config.json` and `preprocessor_config.json` are written byte for byte as published: the
special tokens keep their real ids (<|endoftext|> 151643 ... <|audio_pad|> 151675; note the TTS
tokens are `<tts_pad>`, `<tts_text_bos>`, `<tts_text_eod>`, `<tts_text_bos_single>`, with no bars).
The BPE itself is ours: a small byte-level vocabulary, trained deterministically with `tokenizers` on
the built-in corpus below, so ordinary English/CJK words become multi-byte tokens. Ids 0..255 are the
256 byte symbols in the GPT-2/Qwen order (so "\\n" is 198 and " " is 220, as in the real vocabulary),
then the learned merges. "assistant" and "user" are single tokens, as the prompt slicing needs.

The vocabulary is then padded with unreachable filler entries up to exactly 151,643 entries, the
size of the real one, for two reasons. Without a tokenizer.json, transformers gives the added tokens
the ids len(vocab), len(vocab)+1, ... in id order, whatever added_tokens_decoder says; only a
151,643-entry vocabulary puts <|endoftext|> at 151643 ... <|audio_pad|> at 151675. And transformers
(4.57.3 and 5.x) only considers the `fix_mistral_regex` pre-tokenizer swap the official package asks
for when the vocabulary has more than 100,000 entries. Fillers ("unused<id>") are never produced:
no merge creates them and they are not single symbols.

Same call, same bytes: the output depends only on this file (and the `tokenizers` trainer).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from ..text.tokenizer import set_qwen2_pretokenization

TRAIN_VOCAB_LIMIT = 4096  # upper bound on the learned vocabulary (bytes + merges)
MODEL_MAX_LENGTH = 131072

# (id, content, special) exactly as in the published tokenizer_config.json.
ADDED_TOKENS = [
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
    (151669, "<|audio_start|>", True),
    (151670, "<|audio_end|>", True),
    (151671, "<tts_pad>", True),
    (151672, "<tts_text_bos>", True),
    (151673, "<tts_text_eod>", True),
    (151674, "<tts_text_bos_single>", True),
    (151675, "<|audio_pad|>", True),
]
VOCAB_SIZE = ADDED_TOKENS[0][0]  # 151643: the BPE vocabulary ends right below the first added token
assert [i for i, _, _ in ADDED_TOKENS] == list(range(VOCAB_SIZE, VOCAB_SIZE + len(ADDED_TOKENS)))
# As published (it leaves out <|endoftext|> and <tts_text_eod>).
ADDITIONAL_SPECIAL_TOKENS = [
    "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
    "<|video_pad|>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_bos_single>",
    "<|audio_pad|>",
]
EXTRA_SPECIAL_TOKENS = {
    "image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>", "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
}

# Training text, one "document" a line. It is fed twice, so every pre-token in it (each word with
# its leading space, each number digit, each CJK run) ends up a single token; other text falls back
# on the shorter pieces learned on the way, down to the 256 byte symbols.
CORPUS = """\
The user asked the assistant a question, and the assistant answered the user.
A user writes to the assistant; the assistant speaks to the user. Users and assistants talk.
user: Please read this sentence aloud.
assistant: Sure, here it is.
user: Say it again, more slowly.
assistant: Of course.
Hello, world! How are you today? I'm fine, thank you. And you?
The quick brown fox jumps over the lazy dog. The dog didn't move.
It's a beautiful day, isn't it? We're going to the park, and they've already left.
I can't believe it's already 2024. You'll see; he'd never say that. She's right, we won't stop.
Don't worry, it'll be OK. They're here, I've seen them. CAN'T STOP, WON'T STOP, I'LL BE THERE.
My iPhone and my iPad run iOS; my MacBook runs macOS. The iPhone is new.
JavaScript and TypeScript are popular. JavaScript runs in the browser, TypeScript compiles to JavaScript.
iPhone JavaScript iPhone JavaScript TypeScript YouTube PowerPoint PlayStation GitHub LinkedIn OpenAI
We watched YouTube videos, made a PowerPoint deck, and played PlayStation games at McDonald's.
OpenAI and GitHub published new tools; the HTTPServer class handles requests. CamelCaseWords are tricky.
McDonald ordered an eBay item over WiFi. The WiFi password is on the PowerPoint slide.
Numbers: 2024, 2025, 3.14, 3.14159, 1,000,000 and 42nd. Call me at 12:30 or 9:45 tomorrow.
The price is $19.99, a 50% discount; the car drove 100 km/h for 2.5 hours in 1999.
In 2024 there were 365 days plus one; pi is about 3.14 and e is about 2.718.
Please read chapter 7, pages 12-34, and answer questions 1, 2 and 3 before Friday.
This is a test of the speech system. Sure. This test is simple, we like it, and the system works well.
What time is it? It is time to go home. Where are you from? I am from a small town near the sea.
People say that life is good when you have friends, family, work, food and a little free time.
Could you tell me more about this? Of course, I would be happy to help you with anything you need.
Speech synthesis turns text into natural sounding voice. Speak slowly, clearly and warmly.
Please speak in a calm, gentle and friendly voice, with a little excitement at the end.
A young woman with a bright, slightly edgy voice tells a story about her journey home.
An old man with a deep, mellow voice reads the news in a quiet room.
Good morning everyone, welcome to the show. Today we talk about music, science and history.
The weather is sunny in the morning and rainy in the evening, so take an umbrella.
She opened the door, looked outside, and smiled at the children playing in the garden.
We need to finish the report by Monday; the meeting starts at ten o'clock sharp.
Wait... what?! Really? Yes -- really. (Parentheses), [brackets], {braces} and "quotes".
Visit https://example.com/path?query=1 or write to info@example.com for more details.
a+b=c, x*y/z, #hashtag, @mention, 100%, 5 > 3 < 7, semicolons; colons: dashes - and underscores_here.
“Smart quotes”, ‘single ones’, an em dash — and an ellipsis… are punctuation too.
中文测试：你好，世界！今天是2024年。
你好，欢迎使用语音合成系统。今天天气很好，我们一起去公园散步吧！
我是一个助手，很高兴为你服务。请问你需要什么帮助？
他说：“这本书非常有意思。”我们明天见。谢谢你的帮助。
北京是中国的首都，上海是一个国际化的大都市。中文测试很重要。
请用温柔的语气说话，语速慢一点。你好，世界！
日本語のテキストと English mixed 한국어.
こんにちは、世界！今日はいい天気ですね。日本語のテキストを読みます。
私は東京に住んでいます。カタカナとひらがなと漢字を使います。ありがとうございます。
안녕하세요, 한국어 텍스트입니다. 감사합니다. 안녕하세요!
Guten Morgen! Wie geht es Ihnen? Schöne Grüße aus München, danke schön.
Bonjour, ça va ? Je suis très content de vous voir. Merci beaucoup, à bientôt !
¡Hola! ¿Qué tal? Estoy muy bien, gracias. Mañana vamos a la playa.
Buongiorno, come stai? Grazie mille. Olá, tudo bem? Obrigado, até logo.
Привет, мир! Как дела? Спасибо, всё хорошо.
  leading spaces and trailing newline
Line one
Line two

Tabs\tand  double  spaces   matter.
"""


def _bytes_to_unicode() -> list[str]:
    """The GPT-2/Qwen byte->symbol table, in vocabulary order (index = token id of that byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    symbols = {b: chr(b) for b in printable}
    symbols.update({b: chr(256 + n) for n, b in enumerate(rest)})
    return [symbols[b] for b in printable + rest]


def _train() -> tuple[list[tuple[str, str]], dict[str, int]]:
    """Learn merges on CORPUS with the Qwen2 normaliser/pre-tokenizer; return (merges, vocab)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    set_qwen2_pretokenization(tokenizer)
    trainer = trainers.BpeTrainer(vocab_size=TRAIN_VOCAB_LIMIT, min_frequency=2, show_progress=False,
                                  special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS.splitlines() * 2, trainer=trainer)  # twice: every corpus word merges
    raw = json.loads(tokenizer.to_str())["model"]["merges"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in raw]

    vocab = {symbol: i for i, symbol in enumerate(_bytes_to_unicode())}
    for left, right in merges:
        if left not in vocab or right not in vocab:
            raise RuntimeError(f"merge {left!r} {right!r} uses a symbol outside the vocabulary")
        vocab.setdefault(left + right, len(vocab))
    for word in ("assistant", "user"):
        if word not in vocab:
            raise RuntimeError(f"the trained vocabulary lacks {word!r} as one token; extend CORPUS")
    # Unreachable fillers up to the first added-token id (see the module docstring).
    if len(vocab) > VOCAB_SIZE:
        raise RuntimeError(f"{len(vocab)} learned tokens do not fit below {VOCAB_SIZE}")
    while len(vocab) < VOCAB_SIZE:
        filler = f"unused{len(vocab)}"
        if filler in vocab:
            raise RuntimeError(f"filler {filler!r} collides with a learned token")
        vocab[filler] = len(vocab)
    return merges, vocab


def _json(obj) -> bytes:
    return json.dumps(obj, indent=2, ensure_ascii=False).encode("utf-8")


@functools.lru_cache(maxsize=1)
def _files() -> dict[str, bytes]:
    merges, vocab = _train()
    added = {
        str(i): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": special}
        for i, content, special in ADDED_TOKENS
    }
    tokenizer_config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ADDITIONAL_SPECIAL_TOKENS,
        "extra_special_tokens": EXTRA_SPECIAL_TOKENS,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
        **EXTRA_SPECIAL_TOKENS,
    }
    preprocessor_config = {"padding_side": "left", "padding_value": 0.0, "processor_class": "Qwen3TTSProcessor",
                           "return_attention_mask": True}
    return {
        "vocab.json": json.dumps(vocab, ensure_ascii=False, separators=(",", ":")).encode("utf-8"),
        "merges.txt": "".join(f"{a} {b}\n" for a, b in merges).encode("utf-8"),
        "tokenizer_config.json": _json(tokenizer_config),
        "preprocessor_config.json": _json(preprocessor_config),
    }


def write_text_tokenizer(folder: Path) -> None:
    """Write vocab.json, merges.txt, tokenizer_config.json and preprocessor_config.json into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in _files().items():
        (folder / name).write_bytes(data)
