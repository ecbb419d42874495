"""An unsatisfiable placement is refused up front with a message naming the ask and the nodes."""

import pytest

from asyncrl.runtime.placement_check import PlacementError, RoleBundles, check_placement

TWO_NODES = [{"CPU": 4.0, "GPU": 2.0}, {"CPU": 4.0, "GPU": 2.0}]


def test_fits_across_nodes():
    engines = RoleBundles(role="engines", bundles=({"CPU": 1.0, "GPU": 2.0},) * 2)
    check_placement([engines], TWO_NODES)


def test_tensor_parallel_gpus_must_share_a_node():
    engine = RoleBundles(role="engines", bundles=({"CPU": 1.0, "GPU": 4.0},))
    with pytest.raises(
        PlacementError, match=r"no node holds a engines bundle \{'CPU': 1.0, 'GPU': 4.0\}.*2 node"
    ):
        check_placement([engine], TWO_NODES)


def test_roles_together_exceed_the_cluster():
    trainer = RoleBundles(role="trainer", bundles=({"GPU": 1.0},) * 3)
    engines = RoleBundles(role="engines", bundles=({"GPU": 1.0},) * 2)
    with pytest.raises(PlacementError, match=r"ask for 5 GPU in all, the cluster has 4.*trainer: 3 x"):
        check_placement([trainer, engines], TWO_NODES)
