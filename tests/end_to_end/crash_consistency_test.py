"""A run SIGKILLed at random moments and restarted from its backup each
time (a backup after every batch), on one device or 2 replicas drawn at
random, ends with the uninterrupted one-device run's weights.
`.ci/crash_consistency` makes 50 kills, on 2 worker processes too; here
a few."""

import kill_chain

KILLS = 3


def test_random_kills_and_topologies_resume_to_the_one_device_result(tmp_path):
    found = kill_chain.chain(
        tmp_path, KILLS, seed=2, topologies=("default", "mirrored2")
    )
    assert found["kills"] == KILLS
    assert found["topology_changes"] >= 1, found
    assert found["largest_difference"] <= 1e-6, found
