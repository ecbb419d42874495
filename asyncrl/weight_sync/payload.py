"""Packed weights travelling through seams typed as named tensors (``LLMProxy.model_update`` and friends).

Key decision: the proxy treats a weight update as opaque ``name → value`` pairs and copies only values that
can be cloned, so a one-entry mapping ``{PACKED_WEIGHTS_KEY: handle}`` crosses it untouched. The handle is
whatever the transport moves (a Ray ``ObjectRef`` of ``FlatWeights``, or ``FlatWeights`` itself); the
receiving engine client unwraps it with ``packed_handle`` instead of packing tensors again per engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PACKED_WEIGHTS_KEY = "__asyncrl_packed_weights__"
"""The one key of a packed payload; no model parameter is named like this."""


def packed_payload(handle: Any) -> dict[str, Any]:
    """A named-tensors stand-in carrying ``handle`` (already packed weights) through the proxy."""
    return {PACKED_WEIGHTS_KEY: handle}


def packed_handle(named_tensors: object) -> Any | None:
    """The handle of a packed payload, or None if ``named_tensors`` holds ordinary tensors."""
    if isinstance(named_tensors, Mapping) and PACKED_WEIGHTS_KEY in named_tensors:
        if len(named_tensors) != 1:
            raise ValueError(f"a packed weight payload holds only {PACKED_WEIGHTS_KEY!r}, got more names")
        return named_tensors[PACKED_WEIGHTS_KEY]
    return None
