"""The shape a separate critic is costed at, by the memory plan (``app.memory_plan``) and the simulator
(``sim.trained``) alike: the body of ``critic.model_path`` where its ``config.json`` can be read, else the
policy's; or, with no training config, the shape ``memory.critic_model`` names.

Key decisions:
- The path is resolved by the trainer's own function (``models.loading.critic_model_dir``: a folder, a shipped
  checkpoint's name, or a hub id at ``critic.revision``, the critic's own repository's), but offline only: a
  plan never downloads. So a 1.7B critic beside an 8B policy (or the reverse, as PPO setups often pair them)
  is costed at its own layers, widths and vocabulary.
- A path that cannot be read falls back to the policy's shape, and the reason travels with the shape
  (``CriticShape.source``) into the plan's term and the planner's output: never silently.
- ``memory.critic_model`` is read as the policy's ``model`` is (``resolve_shape``: a named shape, a
  ``config.json`` or its folder), else as ``critic.model_path`` is (a hub id in the offline cache), and one that
  reads as neither is an error naming the key, never the policy's shape: the key exists only to plan with, so a
  name that does not read is a typo, not a path that lives on another machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from asyncrl.config.critic import CriticConfig
from asyncrl.sim.model_shape import NAMED_SHAPES, ModelShape, resolve_shape, shape_from_hf_config


@dataclass(frozen=True)
class CriticShape:
    """A separate critic's decoder shape and, in words, where it came from."""

    shape: ModelShape
    source: str
    """The shape named by where it came from: the ``config.json`` read, or the policy's and why (shown in the
    plan's critic term and by ``asyncrl plan``)."""


def resolve_critic_shape(critic: CriticConfig, policy: ModelShape) -> CriticShape:
    """The shape of the critic body ``critic.model_path`` names (null: a copy of ``policy``), read from its
    ``config.json`` in a folder or the offline hub cache, at ``critic.revision`` as the trainer loads it (the
    whole section is taken, not a path and a revision, so no caller can pair the path with the policy's
    revision); ``policy``'s shape, with the reason, where that cannot be read."""
    model_path = critic.model_path
    if model_path is None:
        return CriticShape(policy, "the policy's shape (no critic.model_path: a copy of the policy)")
    from asyncrl.models.loading import critic_model_dir  # torch: only when a critic names its own body

    try:
        shape = _shape_in(critic_model_dir(critic, local_files_only=True), model_path)
    except (OSError, ValueError) as err:  # not here, not cached, not a decoder config.json, unreadable JSON
        reason = f"{type(err).__name__}: {err}"
        return CriticShape(
            policy, f"the policy's shape, since critic.model_path {model_path!r} could not be read ({reason})"
        )
    return CriticShape(shape, f"the shape in the config.json of critic.model_path {model_path!r}")


def critic_model_shape(spec: str) -> CriticShape:
    """The shape ``memory.critic_model`` names: a named shape, a ``config.json`` or its folder (as the policy's
    ``model``), or a hub id in the offline cache at its default revision (as ``critic.model_path``); a
    ``ValueError`` naming the key where it reads as none of them."""
    source = f"the shape memory.critic_model names, {spec!r}"
    if spec.lower() in NAMED_SHAPES or Path(spec).exists():
        try:
            return CriticShape(resolve_shape(spec), source)
        except ValueError as err:  # a folder without a config.json, or one that is not a decoder's
            raise ValueError(f"memory.critic_model: {err}") from err
    from asyncrl.models.loading import resolve_model_path  # torch: only when no named shape or folder matched

    try:
        keys = ("memory.critic_model", "")  # no revision key: the id is read at its default branch
        directory = resolve_model_path(spec, local_files_only=True, keys=keys)
        return CriticShape(_shape_in(directory, spec), source)
    except (OSError, ValueError) as err:  # not a shipped checkpoint, not a hub id, or not cached
        raise ValueError(
            f"memory.critic_model {spec!r} is neither a named shape ({', '.join(sorted(NAMED_SHAPES))}), a "
            f"config.json or a folder holding one, nor a hub id in the offline cache "
            f"({type(err).__name__}: {err})"
        ) from err


def _shape_in(directory: Path, name: str) -> ModelShape:
    """The shape in ``directory``'s ``config.json`` (a resolved critic body); raises where it cannot be read."""
    config = json.loads((directory / "config.json").read_text())
    return shape_from_hf_config(config, name=name)
