"""Weight sync from the trainer to the engines, versioned: flat per-dtype buffers with a manifest."""

from asyncrl.weight_sync.flat import FlatWeights, TensorEntry, check_flat, pack_state, unpack_state
from asyncrl.weight_sync.payload import PACKED_WEIGHTS_KEY, packed_handle, packed_payload

__all__ = [
    "PACKED_WEIGHTS_KEY",
    "FlatWeights",
    "TensorEntry",
    "check_flat",
    "pack_state",
    "packed_handle",
    "packed_payload",
    "unpack_state",
]
