"""Token-in/token-out trajectories: a conversation keeps its token ids, extended only by what is new.

Why: re-tokenising a conversation on every call drifts (the model's sampled tokens are rarely the
tokenisation of their own text), which silently corrupts the log-probs and masks that training uses. Here a
call whose messages extend its branch's messages renders and tokenises only the new messages and appends
them after the sampled tokens; a call that does not extend them (the harness edited, truncated or retried)
starts a new branch that copies the tokens of the longest shared message prefix (sampled turns included) and
records where and why it forked. Nothing is ever re-tokenised.

Branch token layout, one entry per token::

    [messages 0..2 context][gen prompt][sampled turn][close][message 4 context][gen prompt][sampled]...
     mask 0                 mask 0      mask 1        mask 0  mask 0             mask 0      mask 1
        offsets[i] = number of tokens once message i is complete; None inside the messages one call added
        together (the template renders them as one piece: a branch forks only where a piece ends)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from asyncrl.serve.chat_format import ChatFormat, Message, message_text


def message_key(message: Message) -> str:
    """What makes two messages the same turn: role and text (content with its tool calls written in)."""
    return json.dumps([message["role"], message_text(message)])


@dataclass(kw_only=True)
class Branch:
    """One linear history of a trajectory: its messages and its tokens with mask, log-probs and versions."""

    branch_id: int
    parent: int | None = None
    """The branch whose prefix this one copied (None for the first)."""
    reason: str = ""
    """Why it forked (empty for the first branch)."""
    messages: list[Message] = field(default_factory=list)
    """Messages as rendered into the context (a sampled turn: the model's raw text, tool-call spans included)."""
    keys: list[str] = field(default_factory=list)
    """One comparison key per message (a sampled turn: the key of the message the harness was sent back)."""
    offsets: list[int | None] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    num_turns: int = 0

    def append_context(self, tokens: list[int]) -> None:
        self.token_ids += tokens
        self.loss_mask += [0] * len(tokens)
        self.logprobs += [0.0] * len(tokens)
        self.versions += [-1] * len(tokens)

    def append_sampled(self, tokens: list[int], logprobs: list[float], versions: list[int]) -> None:
        self.token_ids += tokens
        self.loss_mask += [1] * len(tokens)
        self.logprobs += logprobs
        self.versions += versions

    def truncate(self, num_tokens: int) -> None:
        """Drop tokens past ``num_tokens`` (a generation prompt whose call failed)."""
        for array in (self.token_ids, self.loss_mask, self.logprobs, self.versions):
            del array[num_tokens:]

    def add_message(self, message: Message, key: str, *, complete: bool = True) -> None:
        """``complete``: its tokens end here (False inside a piece rendered together with the next)."""
        self.messages.append(message)
        self.keys.append(key)
        self.offsets.append(len(self.token_ids) if complete else None)

    def fork_point(self, num_shared: int) -> int:
        """The most leading messages, up to ``num_shared``, whose tokens end where a piece ends."""
        while num_shared and self.offsets[num_shared - 1] is None:
            num_shared -= 1
        return num_shared

    def fork(self, branch_id: int, num_messages: int, reason: str) -> Branch:
        """A new branch sharing this one's first ``num_messages`` messages, tokens copied."""
        end = self.offsets[num_messages - 1] if num_messages else 0
        assert end is not None, "a branch forks where a piece ends (fork_point)"
        return Branch(
            branch_id=branch_id,
            parent=self.branch_id,
            reason=reason,
            messages=self.messages[:num_messages],
            keys=self.keys[:num_messages],
            offsets=self.offsets[:num_messages],
            token_ids=self.token_ids[:end],
            loss_mask=self.loss_mask[:end],
            logprobs=self.logprobs[:end],
            versions=self.versions[:end],
            num_turns=_num_sampled_turns(self.loss_mask[:end]),
        )

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens before the first sampled one (all of them if the model has not spoken)."""
        return next((i for i, m in enumerate(self.loss_mask) if m), len(self.loss_mask))


def _num_sampled_turns(loss_mask: list[int]) -> int:
    return sum(1 for i, m in enumerate(loss_mask) if m and (i == 0 or not loss_mask[i - 1]))


def _text_prefix_pieces(messages: list[Message], text: str) -> int:
    """How many leading messages' contents, concatenated, are a prefix of ``text``."""
    position = 0
    for count, message in enumerate(messages):
        if not text.startswith(message["content"], position):
            return count
        position += len(message["content"])
    return len(messages)


def closing_text(
    chat_format: ChatFormat,
    tokenizer: Any,
    history: list[Message],
    raw_text: str,
    token_ids: list[int],
    ended_by_stop_token: bool,
) -> str:
    """The text that closes a sampled turn, less the template's end-of-turn marker when the model sampled it."""
    close = chat_format.close(history, raw_text)
    if ended_by_stop_token and token_ids:
        stop_text = tokenizer.decode(token_ids[-1:])
        if close.startswith(stop_text):  # the template's own end-of-turn marker was sampled already
            close = close[len(stop_text) :]
    return close


def common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class TrajectoryTokens:
    """The branches of one trajectory and the incremental tokenisation that grows them."""

    def __init__(self, chat_format: ChatFormat, tokenizer: Any) -> None:
        self.format = chat_format
        self.tokenizer = tokenizer
        self.branches: list[Branch] = []

    @property
    def live(self) -> Branch | None:
        return self.branches[-1] if self.branches else None

    def prompt(
        self, messages: list[Message], keys: list[str], tools: list[dict[str, Any]] | None = None
    ) -> Branch:
        """The branch this call extends (a new one if it extends none), grown by the new messages (rendered
        together: a template may join them, e.g. consecutive tool results) and the generation prompt; its
        ``token_ids`` are the request's prompt. ``tools`` are rendered only where the conversation starts."""
        branch = self._branch_for(keys)
        new = messages[len(branch.keys) :]
        branch.append_context(self._encode(self.format.context(branch.messages, new, tools)))
        for index, (message, key) in enumerate(zip(new, keys[len(branch.keys) :], strict=True)):
            branch.add_message(message, key, complete=index == len(new) - 1)
        branch.append_context(self._encode(self.format.generation_prompt(branch.messages)))
        return branch

    def record(
        self,
        branch: Branch,
        *,
        token_ids: list[int],
        logprobs: list[float],
        versions: list[int],
        raw_text: str,
        key: str,
        ended_by_stop_token: bool,
    ) -> None:
        """Append a sampled turn and the text that closes it; the harness extends the branch by sending the
        turn back as the message whose ``key`` is given."""
        branch.append_sampled(token_ids, logprobs, versions)
        close = closing_text(
            self.format, self.tokenizer, branch.messages, raw_text, token_ids, ended_by_stop_token
        )
        branch.append_context(self._encode(close))
        branch.add_message({"role": "assistant", "content": raw_text}, key)
        branch.num_turns += 1

    def rollback(self, branch: Branch) -> None:
        """Undo a generation prompt whose call failed, so the branch ends at its last complete message."""
        branch.truncate(branch.offsets[-1] if branch.offsets else 0)

    def prompt_text(self, text: str) -> Branch:
        """Completion mode: ``text`` extends a branch when that branch's text (prompts and sampled turns, as
        returned) is a prefix of it; the rest becomes one new prompt piece."""
        best, shared = None, 0
        for branch in self.branches:
            count = _text_prefix_pieces(branch.messages, text)
            if best is None or count >= shared:
                best, shared = branch, count
        pieces = best.messages[:shared] if best is not None else []
        rest = text[sum(len(m["content"]) for m in pieces) :]
        messages = pieces + ([{"role": "prompt", "content": rest}] if rest else [])
        return self.prompt(messages, [message_key(m) for m in messages])

    def _branch_for(self, keys: list[str]) -> Branch:
        live = self.live
        if live is not None and len(keys) > len(live.keys) and keys[: len(live.keys)] == live.keys:
            return live
        if live is None:
            self.branches.append(Branch(branch_id=0))
            return self.branches[-1]
        source = max(self.branches, key=lambda b: common_prefix(b.keys, keys))
        shared = source.fork_point(common_prefix(source.keys, keys))
        reason = (
            f"messages repeat a prefix of branch {live.branch_id} (a retry)"
            if keys == live.keys[: len(keys)]
            else f"message {common_prefix(live.keys, keys)} differs from branch {live.branch_id}'s"
        )
        self.branches.append(source.fork(len(self.branches), shared, reason))
        return self.branches[-1]

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []
