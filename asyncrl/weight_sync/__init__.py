"""Weight sync from the trainer to the engines, versioned: the ``WeightSync`` protocol and its transports."""

from asyncrl.weight_sync.flat import (
    DeviceBucket,
    FlatWeights,
    TensorEntry,
    check_flat,
    pack_state,
    unpack_state,
)
from asyncrl.weight_sync.protocol import LoraAdapter, WeightSync, WeightSyncError, WeightUpdate
from asyncrl.weight_sync.transports import FlatBufferSync, InProcessSync, make_weight_sync

__all__ = [
    "DeviceBucket",
    "FlatBufferSync",
    "FlatWeights",
    "InProcessSync",
    "LoraAdapter",
    "TensorEntry",
    "WeightSync",
    "WeightSyncError",
    "WeightUpdate",
    "check_flat",
    "make_weight_sync",
    "pack_state",
    "unpack_state",
]
