"""The engine side of every transport: check an update against what the engine serves, then hand out tensors.

Nothing is received (no buffer read, no tensor copied) until the version and the manifest pass, so a refused
update leaves the engine on its old weights. Tied embeddings are explicit: a tied model expects both
``model.embed_tokens.weight`` and ``lm_head.weight`` (the trainer always sends ``lm_head.weight``, see
``models.loading.state_dict_for_sync``), though ``named_parameters()`` lists the shared matrix once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from asyncrl.weight_sync.protocol import WeightSync, WeightUpdate, check_manifest, check_version

TIED_NAMES = ("lm_head.weight", "model.embed_tokens.weight")


def expected_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """Parameter name → shape of every tensor an update of ``model`` must carry, both tied names included."""
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for name in TIED_NAMES:
        if name not in shapes:
            other = next((n for n in TIED_NAMES if n in shapes), None)
            if other is not None:
                shapes[name] = shapes[other]
    return shapes


def named_targets(model: Any) -> dict[str, Any]:
    """The model's parameters by name, tied names both present (they are one tensor): what an update that
    patches weights in place (``weight_sync.delta``) writes into."""
    params = dict(model.named_parameters())
    for name in TIED_NAMES:
        other = next((n for n in TIED_NAMES if n in params), None)
        if name not in params and other is not None:
            params[name] = params[other]
    return params


class InPlaceReceiver:
    """One engine's side of transports that patch its weights in place (``fetch`` then ``apply_into``, the
    delta transport): remembers the chain fetched before the engine paused, so applying it costs no read.

    ``prefetch`` may run on another thread than ``apply``; a prefetch that no longer fits (the engine moved
    to another version meanwhile) is dropped and the chain read again."""

    def __init__(self) -> None:
        self._fetched: Any = None

    @staticmethod
    def handles(payload: Any) -> bool:
        """Whether ``payload`` is an update whose transport patches in place."""
        if not isinstance(payload, WeightUpdate):
            return False
        from asyncrl.weight_sync.transports import TRANSPORTS, make_weight_sync

        return payload.transport in TRANSPORTS and hasattr(make_weight_sync(payload.transport), "apply_into")

    def prefetch(self, update: WeightUpdate, serving_version: int) -> None:
        """Read what the update needs while the engine still generates (nothing if it does not patch)."""
        if self.handles(update) and update.version > serving_version:
            from asyncrl.weight_sync.transports import make_weight_sync

            self._fetched = make_weight_sync(update.transport).fetch(update, serving_version)

    def apply(self, model: Any, update: WeightUpdate, serving_version: int) -> None:
        """Check the update (version, manifest) against ``model``, then patch it in place."""
        from asyncrl.weight_sync.transports import make_weight_sync

        check_version(update, serving_version)
        check_manifest(update, expected_shapes(model))
        fetched, self._fetched = self._fetched, None
        make_weight_sync(update.transport).apply_into(update, named_targets(model), serving_version, fetched)


def receive_checked(
    sync: WeightSync, update: WeightUpdate, *, serving_version: int, shapes: Mapping[str, tuple[int, ...]]
) -> Iterator[tuple[str, Any]]:
    """``sync.receive(update)`` after ``check_version`` and ``check_manifest`` (``WeightSyncError`` first)."""
    check_version(update, serving_version)
    check_manifest(update, shapes)
    return sync.receive(update)


def tensors_of(
    payload: WeightUpdate | Mapping[str, Any] | Iterable[tuple[str, Any]],
    *,
    serving_version: int,
    shapes: Mapping[str, tuple[int, ...]],
) -> Iterable[tuple[str, Any]] | Mapping[str, Any]:
    """What an engine copies in: a ``WeightUpdate`` checked and received through the transport it names (with
    that transport's in-process defaults), or named tensors as they are (callers that built them)."""
    if not isinstance(payload, WeightUpdate):
        return payload
    from asyncrl.weight_sync.transports import make_weight_sync

    return receive_checked(
        make_weight_sync(payload.transport), payload, serving_version=serving_version, shapes=shapes
    )
