"""``controller.wait_for_older``: null follows the mode, multi_version cannot turn it off."""

from __future__ import annotations

import pytest

from asyncrl.config.controller import ControllerConfig
from asyncrl.modes import MODE_SPECS, ModeError


@pytest.mark.parametrize("mode", sorted(MODE_SPECS))
def test_null_follows_the_mode(mode: str) -> None:
    assert ControllerConfig(mode=mode).waits_for_older is MODE_SPECS[mode].multi_version


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "async", "partial_rollout"])
def test_every_other_mode_may_turn_it_on(mode: str) -> None:
    assert ControllerConfig(mode=mode, wait_for_older=True).waits_for_older is True
    assert ControllerConfig(mode=mode, wait_for_older=False).waits_for_older is False


def test_multi_version_refuses_false_naming_the_field() -> None:
    with pytest.raises(ModeError, match="controller.wait_for_older"):
        ControllerConfig(mode="multi_version", wait_for_older=False)
    assert ControllerConfig(mode="multi_version", wait_for_older=True).waits_for_older is True
