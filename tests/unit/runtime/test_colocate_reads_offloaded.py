"""``runtime.colocate``: a read of the trainer's state that falls while it is offloaded (a checkpoint after the
step's publication, a replaced engine's catch-up pack) runs with the state reloaded, and offloads it again
after: the offload freed the state's storages in place, so nothing may read them until a reload."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from switch_fakes import IdleTrainer

from asyncrl.config.runtime import SwitchConfig
from asyncrl.runtime.colocate import ColocatedTrainer


class Recording(IdleTrainer):
    """Records the order of its state moves and reads; holds ``nbytes`` of state, offloaded or not."""

    def __init__(self, offloaded: bool, nbytes: int = 16) -> None:
        self.offloaded, self.nbytes, self.calls = offloaded, nbytes, []

    def offload_state(self) -> int:
        self.calls.append("offload")
        self.offloaded = True
        return self.nbytes

    def reload_state(self) -> int:
        self.calls.append("reload")
        moved, self.offloaded = (self.nbytes if self.offloaded else 0), False
        return moved

    def save_checkpoint(self, root: Any, *, extra: Any, keep_last: Any) -> Path:
        self.calls.append("save" if not self.offloaded else "save OFFLOADED")
        return Path(root)

    def pack_for(self, engine: int) -> Any:
        self.calls.append("pack" if not self.offloaded else "pack OFFLOADED")
        return SimpleNamespace(version=self.version)


def switched(trainer: Recording) -> ColocatedTrainer:
    return ColocatedTrainer(trainer, [], SwitchConfig(enabled=True), timeout_s=5, state=trainer)


@pytest.mark.parametrize("read", ["save", "pack"])
def test_a_read_while_offloaded_reloads_first_and_offloads_after(read: str) -> None:
    trainer = Recording(offloaded=True)
    switch = switched(trainer)
    if read == "save":
        switch.save_checkpoint("/ckpt", extra={}, keep_last=None)
    else:
        switch.republisher.inner.pack_for(0)  # the republisher packs through the switch
    assert trainer.calls == ["reload", read, "offload"] and trainer.offloaded


def test_a_read_with_the_state_resident_moves_nothing() -> None:
    """Before the first publication (a resume's first save) or at the run's end the state is resident."""
    trainer = Recording(offloaded=False)
    switched(trainer).save_checkpoint("/ckpt", extra={}, keep_last=None)
    assert trainer.calls == ["reload", "save"] and not trainer.offloaded
