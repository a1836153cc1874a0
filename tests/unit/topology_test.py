"""One topology per strategy, decided in one place."""

import devices
import tensorflow as tf

from keras_ctl._engine import gather
from keras_ctl.distribute import topology


def test_each_local_strategy_has_its_topology():
    found = {
        kind: topology.of(devices.get(kind))
        for kind in ("default", "onedevice", "mirrored", "centralstorage")
    }
    assert {kind: t.replicas for kind, t in found.items()} == {
        "default": 1,
        "onedevice": 1,
        "mirrored": 2,
        "centralstorage": 2,
    }
    assert {kind: t.one_copy for kind, t in found.items()} == {
        "default": False,
        "onedevice": False,
        "mirrored": False,
        "centralstorage": True,
    }
    for t in found.values():  # one process, which writes; no servers
        assert (t.workers, t.chief, t.parameter_servers) == (1, True, False)


def test_only_tpus_need_one_shape_on_every_replica():
    for kind in ("default", "onedevice", "mirrored", "centralstorage"):
        assert not topology.needs_equal_shapes(devices.get(kind))
    # Constructing a TPUStrategy needs a TPU; the check reads only its class.
    tpu = tf.distribute.TPUStrategy.__new__(tf.distribute.TPUStrategy)
    assert topology.needs_equal_shapes(tpu)
    # all_gather's refusal there names the alternative.
    assert "TPUStrategy" in gather.UNEQUAL_ROWS_ON_TPU
    assert "all_gather(values, axis=0)" in gather.UNEQUAL_ROWS_ON_TPU
