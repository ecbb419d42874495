"""The shape a separate critic is costed at, by the memory plan (``app.memory_plan``) and the simulator
(``sim.trained``) alike: the body of ``critic.model_path`` where its ``config.json`` can be read, else the
policy's.

Key decisions:
- The path is resolved as the trainer resolves it (``models.loading.resolve_model_path``, which
  ``load_decoder_body`` calls: a folder, a shipped checkpoint's name, or a hub id at ``model.revision``), but
  offline only: a plan never downloads. So a 1.7B critic beside an 8B policy (or the reverse, as PPO setups
  often pair them) is costed at its own layers, widths and vocabulary.
- A path that cannot be read falls back to the policy's shape, and the reason travels with the shape
  (``CriticShape.source``) into the plan's term and the planner's output: never silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from asyncrl.sim.model_shape import ModelShape, shape_from_hf_config


@dataclass(frozen=True)
class CriticShape:
    """A separate critic's decoder shape and, in words, where it came from."""

    shape: ModelShape
    source: str
    """The shape named by where it came from: the ``config.json`` read, or the policy's and why (shown in the
    plan's critic term and by ``asyncrl plan``)."""


def resolve_critic_shape(model_path: str | None, revision: str, policy: ModelShape) -> CriticShape:
    """The shape of the critic body ``critic.model_path`` names (null: a copy of ``policy``), read from its
    ``config.json`` in a folder or the offline hub cache, at the policy's ``model.revision`` as the trainer
    loads it; ``policy``'s shape, with the reason, where that cannot be read."""
    if model_path is None:
        return CriticShape(policy, "the policy's shape (no critic.model_path: a copy of the policy)")
    from asyncrl.models.loading import resolve_model_path  # torch: only when a critic names its own body

    try:
        directory = resolve_model_path(model_path, revision, local_files_only=True)
        config = json.loads((directory / "config.json").read_text())
        shape = shape_from_hf_config(config, name=model_path)
    except (OSError, ValueError) as err:  # not here, not cached, not a decoder config.json, unreadable JSON
        reason = f"{type(err).__name__}: {err}"
        return CriticShape(
            policy, f"the policy's shape, since critic.model_path {model_path!r} could not be read ({reason})"
        )
    return CriticShape(shape, f"the shape in the config.json of critic.model_path {model_path!r}")
