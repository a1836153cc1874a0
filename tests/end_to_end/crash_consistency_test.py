"""A run SIGKILLed at random moments, restarted from its backup each time
(a backup after every batch), ends with the uninterrupted run's weights,
restarted on one device or on another topology each time.
`.ci/crash_consistency` makes 50 kills; here a few."""

import kill_chain

KILLS = 5


def test_random_kills_resume_to_the_uninterrupted_result(tmp_path):
    found = kill_chain.chain(tmp_path, KILLS, seed=1)
    assert found["kills"] == KILLS
    assert found["largest_difference"] <= 1e-6, found


def test_random_kills_and_topologies_resume_to_the_one_device_result(tmp_path):
    found = kill_chain.chain(
        tmp_path, KILLS, seed=2, topologies=("default", "mirrored2")
    )
    assert found["kills"] == KILLS
    assert found["topology_changes"] >= 1, found
    assert found["largest_difference"] <= 1e-6, found
