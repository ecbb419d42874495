"""The SampleBuffer between rollout and training (the staleness arithmetic of the async ratio α is ``asyncrl.staleness``)."""

from asyncrl.buffer.records import Admission, BufferAccounting, DropKind, DroppedGroup
from asyncrl.buffer.sample_buffer import (
    AdmissionTimeoutError,
    BatchTimeoutError,
    BufferClosedError,
    SampleBuffer,
)

__all__ = [
    "Admission",
    "AdmissionTimeoutError",
    "BatchTimeoutError",
    "BufferAccounting",
    "BufferClosedError",
    "DropKind",
    "DroppedGroup",
    "SampleBuffer",
]
