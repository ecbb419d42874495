"""Byte-level BPE tokenizers trained by the project, identical to what ``AutoTokenizer`` rebuilds for qwen2.

Key decision: in transformers 5.x ``AutoTokenizer`` on a ``model_type=qwen2`` directory returns
``Qwen2Tokenizer``, which rebuilds its normalizer and pre-tokenizer from fixed code (NFC, Qwen2's split regex,
then a byte-level step) and keeps only the vocabulary and merges of the saved file. A BPE trained any other
way silently gets different ids after reloading ("123" splits differently). So training uses exactly those
components, taken from transformers itself rather than copied.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

EOS_TOKEN = "<|endoftext|>"
"""End of text; also the padding token, as in Qwen2 (padding is masked out, so sharing it is harmless)."""
CHAT_START_TOKEN = "<|im_start|>"
CHAT_END_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (EOS_TOKEN, CHAT_START_TOKEN, CHAT_END_TOKEN)
"""Special tokens, given the first ids in this order (EOS is id 0)."""
NUM_BYTES = 256

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, the format of Qwen2's own chat models: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message."""


def qwen2_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Qwen2's pre-tokenizer: its split regex (digits one by one, words, punctuation runs), then bytes."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 512, *, padding_side: Literal["left", "right"] = "left"
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` that keeps its ids when saved and reloaded with ``AutoTokenizer``.

    All 256 bytes are in the vocabulary, so any text encodes. The result may hold fewer than ``vocab_size``
    tokens when the texts offer too few merges; size a model with ``len(tokenizer)``. ``padding_side`` is given
    to the constructor because only then is it saved (left padding suits batched generation).
    """
    if vocab_size < NUM_BYTES + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size must be >= {NUM_BYTES + len(SPECIAL_TOKENS)} (bytes + special), got {vocab_size}"
        )
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = qwen2_pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        padding_side=padding_side,
        chat_template=CHAT_TEMPLATE,
        extra_special_tokens={"chat_start_token": CHAT_START_TOKEN, "chat_end_token": CHAT_END_TOKEN},
    )
