"""The trained tokenizer keeps its ids through save_pretrained + AutoTokenizer (qwen2 rebuilds its pre-tokenizer)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from asyncrl.models.corpus import sample_texts
from asyncrl.models.loading import save_tiny
from asyncrl.models.tiny import build_tiny_model
from asyncrl.models.tokenizer import CHAT_END_TOKEN, CHAT_START_TOKEN, EOS_TOKEN, train_tokenizer

TEXTS = [
    "count 17 to 20: 17 18 19 20",
    "12345 + 678 = 13023",
    "  leading spaces,   inner   runs\tand a tab",
    "Hello, world! What's 3.14 * 2?\n\nNew paragraph;\r\nWindows line.\n",
    "sum 3 1 4: 3 4 8 = 8 #### 8",
    "ünïcödé, 中文, emoji 🙂 and e\u0301 (combining)",
    f"{CHAT_START_TOKEN}user\nreverse a b c:{CHAT_END_TOKEN}\n{CHAT_START_TOKEN}assistant\n c b a{EOS_TOKEN}",
    "",
]


def _reload(tokenizer, tmp_path):
    save_tiny(
        build_tiny_model(vocab_size=len(tokenizer), hidden_size=32, num_heads=2, num_layers=1),
        tokenizer,
        tmp_path,
    )
    return AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)


def test_ids_round_trip_through_auto_tokenizer(tiny_pair, tiny_dir):
    _, tokenizer = tiny_pair
    loaded = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    assert type(loaded).__name__ == "Qwen2Tokenizer"  # the class that rebuilds the pre-tokenizer
    for text in TEXTS:
        assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"], text


def test_decoding_is_lossless_for_nfc_text(tiny_pair):
    _, tokenizer = tiny_pair
    for text in TEXTS[:5]:
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_digits_are_single_tokens_and_specials_have_the_first_ids(tiny_pair):
    _, tokenizer = tiny_pair
    assert tokenizer.convert_ids_to_tokens(tokenizer("x 2025")["input_ids"])[-4:] == ["2", "0", "2", "5"]
    assert tokenizer.convert_tokens_to_ids([EOS_TOKEN, CHAT_START_TOKEN, CHAT_END_TOKEN]) == [0, 1, 2]
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (0, 0)
    chat_ids = tokenizer(TEXTS[6])["input_ids"]
    assert chat_ids[0] == 1 and chat_ids.count(2) == 1 and chat_ids[-1] == 0


def test_chat_template_is_chatml(tiny_dir):
    loaded = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    messages = [{"role": "user", "content": "copy a b:"}]
    rendered = loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\ncopy a b:<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_side_survives_saving(side, tmp_path):
    tokenizer = train_tokenizer(sample_texts(50), 300, padding_side=side)
    assert _reload(tokenizer, tmp_path).padding_side == side


def test_training_is_deterministic_and_bounded_by_vocab_size():
    first = train_tokenizer(sample_texts(200), 320)
    second = train_tokenizer((text for text in sample_texts(200)), 320)  # any iterable, e.g. a generator
    assert first.get_vocab() == second.get_vocab()
    assert len(first) <= 320


def test_vocab_smaller_than_bytes_is_rejected():
    with pytest.raises(ValueError, match="vocab_size must be >= 259"):
        train_tokenizer(["a"], 100)
