"""One topology per strategy, decided in one place."""

import devices

from keras_ctl import _topology


def test_each_local_strategy_has_its_topology():
    found = {
        kind: _topology.of(devices.get(kind))
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
