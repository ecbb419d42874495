"""Stop strings are checked over a tail window of the output: the same step as decoding the whole output,
with decode work linear in the output's length instead of quadratic."""

from __future__ import annotations

import random
from dataclasses import replace

from engine_testlib import CharTokenizer, drain, engine, request

from asyncrl.engine.stop_strings import stop_string_hit, stop_window
from asyncrl.models.loading import load_tokenizer
from asyncrl.types import FinishReason


def _first_stop_step(hit, token_ids: list[int], start: int) -> int | None:
    """The step (tokens appended) at which ``hit`` first says stop, checking after every token as the engine does."""
    for end in range(start + 1, len(token_ids) + 1):
        if hit(token_ids[:end]):
            return end
    return None


def test_the_window_stops_at_the_same_step_as_the_whole_output_on_a_byte_level_tokenizer() -> None:
    """Random outputs over the shipped byte-level tokenizer, mostly one byte per token (the tightest window)
    and rich in bytes of partial UTF-8 characters (decoded as U+FFFD until completed, or for good), with stop
    strings taken from their text, ASCII, multi-byte or containing U+FFFD: the window stops where the
    whole-output check stops, or neither does."""
    tokenizer = load_tokenizer("")
    rng = random.Random(0)
    vocab = len(tokenizer)
    single_bytes = [t for t in range(vocab) if len(tokenizer.convert_ids_to_tokens(t)) == 1]
    partial = [t for t in single_bytes if "\ufffd" in tokenizer.decode([t])]
    assert (
        len(single_bytes) == 256 and len(partial) == 128
    )  # any byte, and UTF-8's lead and continuation bytes

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    compared = stopped = 0
    for _ in range(300):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 5))]
        output = [rng.choice((partial, single_bytes, range(vocab))[rng.randrange(3)]) for _ in range(60)]
        ids, start = prompt + output, len(prompt)
        text = decode(output)
        stops = []
        for _ in range(rng.randrange(1, 3)):
            at, length = rng.randrange(len(text)), rng.randrange(1, 8)
            stops.append(text[at : at + length])
        if rng.random() < 0.2:
            stops.append("never \u00e9 here")

        def whole(prefix: list[int], stops=stops, start=start) -> bool:
            return any(s in decode(prefix[start:]) for s in stops)

        def window(prefix: list[int], stops=stops, start=start) -> bool:
            return stop_string_hit(decode, prefix, start, stops)

        expected = _first_stop_step(whole, ids, start)
        assert _first_stop_step(window, ids, start) == expected, (ids, start, stops)
        compared += 1
        stopped += expected is not None
    assert compared == 300 and stopped > 250


class CountingTokenizer(CharTokenizer):
    """``CharTokenizer`` counting every token it decodes."""

    def __init__(self) -> None:
        self.decoded = 0

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        self.decoded += len(token_ids)
        return super().decode(token_ids, skip_special_tokens)


def test_decode_work_grows_linearly_with_the_output(qwen2) -> None:
    """A stop string that never appears (CharTokenizer decodes to lower-case letters) over a long output: each
    step decodes at most the window, and the returned text is decoded once; the whole output every step
    would decode n²/2 tokens (7 k here, against 1.7 k allowed; the tiny model's context is 128 positions)."""
    tokenizer = CountingTokenizer()
    core = engine(qwen2, tokenizer=tokenizer)
    stops = ("NEVER",)
    n = 120
    core.add_request(
        request("long", [1], temperature=0, max_new_tokens=n, ignore_eos=True, stop_strings=stops)
    )
    out = drain(core)["long"]
    assert (len(out.token_ids), out.finish_reason) == (n, FinishReason.LENGTH)
    assert out.text == CharTokenizer().decode(out.token_ids)
    assert tokenizer.decoded <= n * stop_window(stops) + n


def test_a_long_output_stops_where_its_stop_string_first_appears(qwen2) -> None:
    """Past the window's length, the stop string is found at its first occurrence and the text returned is
    the whole output's, as before."""
    reference = engine(qwen2, tokenizer=CharTokenizer())
    reference.add_request(request("ref", [1, 2, 3], temperature=0, max_new_tokens=120, ignore_eos=True))
    greedy = drain(reference)["ref"].token_ids
    text = CharTokenizer().decode(greedy)
    stop = text[100:103]
    cut = text.index(stop) + len(stop)
    core = engine(qwen2, tokenizer=CharTokenizer())
    core.add_request(request("s", [1, 2, 3], temperature=0, max_new_tokens=120, stop_strings=(stop,)))
    out = drain(core)["s"]
    assert (out.token_ids, out.finish_reason) == (greedy[:cut], FinishReason.STOP)
    assert out.text == text[:cut]


def test_a_character_cut_at_the_windows_start_never_stops_a_request() -> None:
    """The window may begin inside a character (here 数, three byte tokens) and decode its tail as U+FFFD: a
    stop string matching that artefact is not in the output, so the hit is checked on the whole output."""
    tokenizer = load_tokenizer("")
    character = tokenizer.encode("数")
    x = tokenizer.encode("x")
    assert len(character) == 3 and len(x) == 1
    stops = ["\ufffd" + "xx"]  # 5 bytes: a window of 13 tokens, 数's last byte and twelve x
    output = character + x * 12
    assert tokenizer.decode(output[-stop_window(stops) :]).startswith("\ufffd")

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    assert _first_stop_step(lambda ids: stop_string_hit(decode, ids, 0, stops), output, 0) is None


class SpaceTokenizer:
    """SentencePiece's decoding on a toy vocabulary: token 0 is a lone word boundary ("▁", a space), token t
    the letter ``chr(ord("a") + t - 1)``; the decoded text drops its leading space, as Llama's does."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(" " if t == 0 else chr(ord("a") + t - 1) for t in token_ids).removeprefix(" ")


def test_a_space_dropped_at_the_windows_start_is_covered_by_the_margin() -> None:
    """``" x"`` is two bytes; a window of just two tokens would decode ``▁x`` as ``"x"`` and miss it."""
    output = [1, 2, 0, 24, 3]  # "ab xc"
    stops = [" x"]
    hit = _first_stop_step(lambda ids: stop_string_hit(SpaceTokenizer().decode, ids, 0, stops), output, 0)
    assert hit == 4
    lifted = [5] * 20 + output  # the occurrence past the window's margin from the output's start
    hit = _first_stop_step(lambda ids: stop_string_hit(SpaceTokenizer().decode, ids, 0, stops), lifted, 0)
    assert hit == 24


def test_a_stop_string_inside_a_given_prefix_stops_at_the_first_new_token(qwen2) -> None:
    """A continued request's prefix was never checked by this engine: its first sampled token is checked
    against the whole output, so a stop string far back in the prefix (past any window) stops it at once,
    as decoding the whole output every step did."""
    prefix = [2] * 40 + [3, 4] + [2] * 40  # "ccc…de ccc…": "de" 40 tokens before the end
    core = engine(qwen2, tokenizer=CharTokenizer())
    continued = request("c", [1], temperature=0, max_new_tokens=90, stop_strings=("de",))
    core.add_request(
        replace(
            continued,
            prefix_token_ids=prefix,
            prefix_logprobs=[0.0] * len(prefix),
            prefix_versions=[0] * len(prefix),
        )
    )
    out = drain(core)["c"]
    assert (len(out.token_ids), out.finish_reason) == (len(prefix) + 1, FinishReason.STOP)
