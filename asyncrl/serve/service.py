"""What one OpenAI call does: bound-check, extend its trajectory's tokens, generate through the proxy, record.

Key decision: the proxy is the only way to the engines, so a call in flight during a weight update is held or
continued exactly as the proxy's update policy says (``drain``: it waits for the update and then runs under
one version; ``in_flight``: it continues under the new weights with its tokens tagged). The caller sees a
slower answer, never an error for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from asyncrl.config.serve import ServeConfig
from asyncrl.serve.chat_format import (
    ChatFormat,
    Message,
    end_of_turn_ids,
    harness_message,
    make_chat_format,
    tools_message,
)
from asyncrl.serve.deltas import TextDeltas
from asyncrl.serve.schemas import ChatRequest, CompletionRequest, ServeError, check_bounds
from asyncrl.serve.tito import Branch, TrajectoryTokens, message_key
from asyncrl.serve.toolcalls import make_tool_parser, parse_llama3_tool_calls
from asyncrl.serve.trajectories import ServedTrajectory, TrajectorySink, TrajectoryState, TrajectoryStore
from asyncrl.types import FinishReason, Generation, Request, SamplingParams, TokenObserver

logger = logging.getLogger(__name__)


TextObserver = Callable[[int, str], None]
"""Hears ``(choice index, new text)`` while a call's answers are generated: a streaming route's deltas."""


class GenerateClient(Protocol):
    """The proxy as the service uses it; ``observe`` hears each request's output so far, where the engines
    can report it (the built-in one can; others give nothing until the answer is whole)."""

    async def generate(self, request: Request, observe: TokenObserver | None = None) -> Generation: ...


@dataclass(kw_only=True)
class Choice:
    """One answer of a call, as the route renders it."""

    text: str
    """The content returned (tool-call spans removed for chat)."""
    tool_calls: list[dict[str, str]]
    finish_reason: str
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]


@dataclass(kw_only=True)
class CallResult:
    choices: list[Choice]
    num_prompt_tokens: int
    trajectory_id: str | None
    branch: int | None


class CompletionService:
    """Serves chat and completion calls over ``proxy``, recording named trajectories in ``store``."""

    def __init__(
        self,
        *,
        proxy: GenerateClient,
        tokenizer: Any,
        config: ServeConfig,
        sink: TrajectorySink | None = None,
        seed: int = 0,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.proxy = proxy
        self.tokenizer = tokenizer
        self.config = config
        self.seed = seed
        self.format: ChatFormat = make_chat_format(config.chat_format, tokenizer, chat_template_kwargs)
        self.parse_tool_calls = make_tool_parser(
            config.tool_parser if self.format.renders_tools else "hermes",
            getattr(tokenizer, "chat_template", None),
        )
        self.store = TrajectoryStore(config, self.format, tokenizer, sink)
        self.stop_token_ids = end_of_turn_ids(tokenizer) if config.chat_format == "template" else ()
        self.reward_fn = load_reward_fn(config.reward_fn) if config.reward_fn else None
        self._num_calls = 0
        self.calls = {"in_flight": 0, "admitting": 0, "refused": 0}
        """Chat/completion calls in the app now, those of them waiting for their trajectory's admission, and
        calls refused for load so far (``app.CallLimit`` and ``_waiting_for_admission`` keep them)."""

    # ---- routes -----------------------------------------------------------------------------------------

    async def chat(
        self,
        request: ChatRequest,
        trajectory_id: str | None,
        group_id: str | None,
        on_text: TextObserver | None = None,
    ) -> CallResult:
        """A chat call; ``on_text`` (streaming) hears each answer's content as it is generated."""
        max_tokens = check_bounds(request, self.config, tracked=trajectory_id is not None)
        messages, tools = self._messages(request)
        keys = [message_key(m) for m in messages]
        sampling = self._sampling(request, max_tokens)
        return await self._call(
            trajectory_id,
            group_id,
            request.n,
            sampling,
            lambda tokens: tokens.prompt(messages, keys, tools),
            kind="chat",
            on_text=on_text,
        )

    def _messages(self, request: ChatRequest) -> tuple[list[Message], list[dict[str, Any]] | None]:
        """The request's messages as templates read them, and the tools the template renders (a template
        that knows no tools gets them announced in a first system message instead)."""
        try:
            messages = [harness_message(m.model_dump(exclude_none=True)) for m in request.messages]
        except ValueError as err:
            raise ServeError(400, f"messages: {err}", "messages") from err
        tools = (
            [t.model_dump() for t in request.tools]
            if request.tools and request.tool_choice != "none"
            else None
        )
        if tools and not self.format.renders_tools:
            return [tools_message(tools), *messages], None
        return messages, tools

    async def complete(
        self,
        request: CompletionRequest,
        trajectory_id: str | None,
        group_id: str | None,
        on_text: TextObserver | None = None,
    ) -> CallResult:
        """A raw-text completion; on a named trajectory the prompt extends it by text (``prompt_text``).
        ``on_text`` (streaming) hears each answer's text as it is generated."""
        max_tokens = check_bounds(request, self.config, tracked=trajectory_id is not None)
        if not request.prompt:
            raise ServeError(400, "prompt must not be empty", "prompt")
        sampling = self._sampling(request, max_tokens)
        return await self._call(
            trajectory_id,
            group_id,
            request.n,
            sampling,
            lambda tokens: tokens.prompt_text(request.prompt),
            kind="completion",
            on_text=on_text,
        )

    async def finish(self, trajectory_id: str, reward: float | None) -> ServedTrajectory:
        """The harness ends an episode: with its reward, or scored by ``serve.reward_fn``."""
        self.store.sink.check(trajectory_id, None)
        trajectory = self.store.get(trajectory_id)
        async with trajectory.lock:  # a call still running on it lands first
            if reward is None:
                reward = await self._score(trajectory)
            self.store.end(trajectory, TrajectoryState.FINISHED, reward=reward)
        return trajectory

    async def abort(self, trajectory_id: str, reason: str) -> ServedTrajectory:
        self.store.sink.check(trajectory_id, None)
        trajectory = self.store.get(trajectory_id)
        async with trajectory.lock:
            self.store.end(trajectory, TrajectoryState.ABORTED, reason=reason or "aborted by the harness")
        return trajectory

    # ---- one call ---------------------------------------------------------------------------------------

    async def _call(
        self,
        trajectory_id: str | None,
        group_id: str | None,
        n: int,
        sampling: SamplingParams,
        prompt: Callable[[TrajectoryTokens], Branch],
        *,
        kind: str,
        on_text: TextObserver | None,
    ) -> CallResult:
        if trajectory_id is None:  # an unnamed call: n independent one-turn trajectories, not kept
            self._num_calls += 1
            pairs = []
            for _ in range(n):
                tokens = self._tokens(kind)
                pairs.append((tokens, prompt(tokens)))
            num_prompt = len(pairs[0][1].token_ids)
            choices = await asyncio.gather(
                *(
                    self._turn(
                        f"call-{self._num_calls}.{i}",
                        branch,
                        0,
                        sampling,
                        tokens,
                        kind,
                        self._observer(i, on_text, kind),
                    )
                    for i, (tokens, branch) in enumerate(pairs)
                )
            )
            return CallResult(
                choices=list(choices), num_prompt_tokens=num_prompt, trajectory_id=None, branch=None
            )
        self.store.sink.check(trajectory_id, group_id)
        trajectory = self.store.open(trajectory_id, group_id, kind)
        async with self._admitted(trajectory):
            branch = prompt(trajectory.tokens)
            num_prompt = len(branch.token_ids)
            try:
                choice = await self._turn(
                    trajectory_id,
                    branch,
                    branch.num_turns,
                    sampling,
                    trajectory.tokens,
                    kind,
                    self._observer(0, on_text, kind),
                )
            finally:
                trajectory.last_active = self.store.clock()
        return CallResult(
            choices=[choice],
            num_prompt_tokens=num_prompt,
            trajectory_id=trajectory_id,
            branch=branch.branch_id,
        )

    @contextlib.asynccontextmanager
    async def _admitted(self, trajectory: ServedTrajectory) -> AsyncIterator[None]:
        """Hold ``trajectory``'s lock, the trajectory admitted by the sink (on its first call: a group's
        admission ticket, which may wait for buffer capacity)."""
        if trajectory.admitted:
            async with trajectory.lock:
                yield
            return
        with self._waiting_for_admission(trajectory):
            await trajectory.lock.acquire()
            try:
                if not trajectory.admitted:  # another call of it may have been admitted meanwhile
                    await self.store.sink.admit(trajectory)
                    trajectory.admitted = True
            except BaseException:
                trajectory.lock.release()
                raise
        try:
            yield
        finally:
            trajectory.lock.release()

    @contextlib.contextmanager
    def _waiting_for_admission(self, trajectory: ServedTrajectory) -> Iterator[None]:
        """Count the call in ``calls["admitting"]`` until its trajectory is admitted: ``app.CallLimit`` leaves
        those out of ``serve.max_concurrent_calls``, so calls waiting for capacity never take the places that
        the admitted trajectories, whose completion (a trained batch) frees it, need. They have a bound of
        their own, the same number: a call that may wait (behind a call of its trajectory waiting already, or
        in the sink) is refused with 429 while ``max_concurrent_calls`` calls wait."""
        limit = self.config.max_concurrent_calls
        may_wait = trajectory.admitting > 0 or self.store.sink.may_wait(trajectory)
        if may_wait and self.calls["admitting"] >= limit:
            self.calls["refused"] += 1
            raise ServeError(
                429,
                f"serve.max_concurrent_calls={limit} calls already wait for admission (a new group waits for "
                "buffer capacity, which a trained batch frees); retry after the Retry-After delay",
                None,
                "rate_limit_error",
            )
        self.calls["admitting"] += 1
        trajectory.admitting += 1
        try:
            yield
        finally:
            self.calls["admitting"] -= 1
            trajectory.admitting -= 1

    def _tokens(self, kind: str) -> TrajectoryTokens:
        return self.store.new_tokens(kind)

    def _observer(self, index: int, on_text: TextObserver | None, kind: str) -> TokenObserver | None:
        """The token observer feeding answer ``index``'s text pieces to ``on_text`` (None: not streaming)."""
        if on_text is None:
            return None
        return TextDeltas(
            self.tokenizer,
            lambda text: on_text(index, text),
            chat=kind == "chat",
            json_calls=self.parse_tool_calls is parse_llama3_tool_calls,
        )

    async def _turn(
        self,
        name: str,
        branch: Branch,
        turn: int,
        sampling: SamplingParams,
        tokens: TrajectoryTokens,
        kind: str,
        observe: TokenObserver | None,
    ) -> Choice:
        """Generate one turn on ``branch`` and record it (rolled back if the generation fails)."""
        request = self._request(f"{name}/b{branch.branch_id}/t{turn}", name, branch, sampling, tokens)
        try:
            generation = await self.proxy.generate(request, observe)
        except Exception as err:  # deliberate: an engine failure is this call's 503, never the server's crash
            tokens.rollback(branch)
            logger.warning("generation %s failed: %s: %s", request.request_id, type(err).__name__, err)
            raise ServeError(
                503, f"generation failed: {type(err).__name__}: {err}", None, "server_error"
            ) from err
        return self._record(branch, tokens, generation, kind)

    def _request(
        self, request_id: str, name: str, branch: Branch, sampling: SamplingParams, tokens: TrajectoryTokens
    ) -> Request:
        """The engine request of a turn: the branch's tokens, seeded by the request id unless the call named a
        seed, routed by the trajectory name (its prefix stays in one engine's cache). A context that cannot
        hold ``max_tokens`` more is refused (400) and the branch rolled back."""
        if len(branch.token_ids) + sampling.max_new_tokens > self.config.max_context_tokens:
            tokens.rollback(branch)
            raise ServeError(
                400,
                f"context of {len(branch.token_ids)} tokens + max_tokens={sampling.max_new_tokens} "
                f"exceeds serve.max_context_tokens={self.config.max_context_tokens}",
                "messages",
            )
        seed = sampling.seed if sampling.seed is not None else _seed(self.seed, request_id)
        return Request(
            request_id=request_id,
            prompt_token_ids=list(branch.token_ids),
            sampling=SamplingParams(**{**_fields(sampling), "seed": seed}),
            affinity_key=name,
        )

    def _record(self, branch: Branch, tokens: TrajectoryTokens, generation: Generation, kind: str) -> Choice:
        """Append the sampled tokens to ``branch`` as they were generated (the returned message's key, so the
        next call can recognise it) and render the answer: content, parsed tool calls, finish reason."""
        token_ids = list(generation.token_ids)
        raw = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        content, calls = self.parse_tool_calls(raw) if kind == "chat" else (raw, [])
        stopped = generation.finish_reason is FinishReason.STOP
        returned = harness_message(
            {"role": "assistant", "content": content, "tool_calls": [{"function": c} for c in calls]}
        )
        tokens.record(
            branch,
            token_ids=token_ids,
            logprobs=list(generation.logprobs),
            versions=list(generation.versions),
            raw_text=raw,
            key=message_key(returned),
            ended_by_stop_token=stopped and bool(token_ids) and token_ids[-1] in self._all_stop_ids(),
        )
        finish = ("tool_calls" if calls else "stop") if stopped else "length"
        return Choice(
            text=content,
            tool_calls=calls,
            finish_reason=finish,
            token_ids=token_ids,
            logprobs=list(generation.logprobs),
            versions=list(generation.versions),
        )

    def _sampling(self, request: ChatRequest | CompletionRequest, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            stop_strings=tuple(request.stops()),
            stop_token_ids=self.stop_token_ids,
            seed=request.seed,
        )

    def _all_stop_ids(self) -> set[int]:
        eos = self.tokenizer.eos_token_id
        return set(self.stop_token_ids) | ({eos} if eos is not None else set())

    async def _score(self, trajectory: ServedTrajectory) -> float:
        if self.reward_fn is None:
            raise ServeError(400, "a finish without 'reward' needs serve.reward_fn to score it", "reward")
        branch = trajectory.live_branch
        messages = list(branch.messages) if branch else []
        try:
            return float(await asyncio.to_thread(self.reward_fn, messages))
        except Exception as err:  # deliberate: a failing reward function fails this finish only
            raise ServeError(
                500,
                f"serve.reward_fn failed on {trajectory.trajectory_id!r}: {type(err).__name__}: {err}",
                None,
                "server_error",
            ) from err


def load_reward_fn(path: str) -> Callable[[list[Message]], float]:
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _seed(run_seed: int, request_id: str) -> int:
    digest = hashlib.blake2b(f"{run_seed}\0serve\0{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _fields(sampling: SamplingParams) -> dict[str, Any]:
    return {name: getattr(sampling, name) for name in sampling.__dataclass_fields__}
