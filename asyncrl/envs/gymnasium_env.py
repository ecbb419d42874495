"""``gymnasium``: any gymnasium environment whose observations are text, as a ``SyncEnv``.

Observations are taken from a ``Text`` observation space as they are, otherwise from ``render()`` when the
env was made with ``render_mode='ansi'`` (FrozenLake, Taxi, CliffWalking, Blackjack…). Actions: a ``Text``
action space receives the response as is; a ``Discrete`` one is addressed by ``action_names`` (the response
must be exactly one name) or, without names, by the action index written as a number. A response naming no
action costs ``invalid_action_penalty`` and the env is not stepped.

Key decision: gymnasium envs are blocking, so the registry wraps this in ``ThreadedEnv``; gymnasium itself is an
optional dependency (the ``gym`` extra), imported only when such an env is built.
"""

from __future__ import annotations

from typing import Any

from asyncrl.config.env import EnvConfig
from asyncrl.envs.base import EnvError, StepResult


def import_gymnasium() -> Any:
    try:
        import gymnasium
    except ImportError:
        raise ImportError(
            "env.type 'gymnasium' needs the gymnasium package: pip install 'asyncrl[gym]' (gymnasium==1.4.0)"
        ) from None
    return gymnasium


class GymnasiumEnv:
    """A ``SyncEnv`` over ``gymnasium.make(env.gymnasium.id, **env.gymnasium.kwargs)`` (module docstring)."""

    def __init__(self, config: EnvConfig) -> None:
        gymnasium = import_gymnasium()
        self.config = config.gymnasium
        self.env = gymnasium.make(self.config.id, **self.config.kwargs)
        self.text_actions = isinstance(self.env.action_space, gymnasium.spaces.Text)
        self.text_observations = isinstance(self.env.observation_space, gymnasium.spaces.Text)
        if not self.text_observations and self.env.render_mode != "ansi":
            raise ValueError(
                f"env.gymnasium.id={self.config.id!r} has no text observations: give it a Text observation space "
                "or make it with env.gymnasium.kwargs.render_mode='ansi'"
            )
        if not self.text_actions and not isinstance(self.env.action_space, gymnasium.spaces.Discrete):
            raise ValueError(
                f"env.gymnasium.id={self.config.id!r}: only Text and Discrete action spaces are supported"
            )
        if (
            self.config.action_names
            and not self.text_actions
            and len(self.config.action_names) != self.env.action_space.n
        ):
            raise ValueError(
                f"env.gymnasium.action_names has {len(self.config.action_names)} names, the action space "
                f"{self.env.action_space.n} actions"
            )
        self.done = True

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed)
        self.done = False
        return self._text(observation), dict(info)

    def step(self, action: str) -> StepResult:
        if self.done:
            raise EnvError(
                f"gymnasium {self.config.id}: step() called before reset() or after the episode ended"
            )
        parsed = self.parse_action(action)
        if parsed is None:
            note = f"invalid action {action.strip()[:20]!r}: answer one of {', '.join(self.action_words())}\n"
            return StepResult(note, -self.config.invalid_action_penalty, False, False, {"invalid": True})
        observation, reward, terminated, truncated, info = self.env.step(parsed)
        self.done = terminated or truncated
        return StepResult(
            self._text(observation), float(reward), terminated, truncated, {**info, "invalid": False}
        )

    def action_words(self) -> list[str]:
        if self.text_actions:
            return ["any text"]
        return list(self.config.action_names) or [str(i) for i in range(self.env.action_space.n)]

    def parse_action(self, text: str) -> Any:
        """The gymnasium action a response names, or None."""
        if self.text_actions:
            return text if self.env.action_space.contains(text) else None
        words = self.action_words()
        word = text.strip().lower()
        lowered = [w.lower() for w in words]
        return lowered.index(word) if word in lowered else None

    def _text(self, observation: Any) -> str:
        return str(observation) if self.text_observations else str(self.env.render())
