"""Round trips per step: no more than the hand loops, and one per step
inside an execution of several steps.

Counted in the traced step graphs under 2 worker processes, each weighted
by how often it runs (`benchmarks/collectives.py`): deterministic, unlike
a timing.
"""

import json
import os

import children
import pytest


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    out = tmp_path_factory.mktemp("collectives") / "counts.json"
    result = children.run(
        [
            *children.LAUNCHER,
            "--workers",
            2,
            "--timeout",
            # 145 s alone; twice that beside another test process.
            600,
            "--",
            children.PYTHON,
            os.path.join(children.ROOT, "benchmarks", "collectives.py"),
            out,
        ],
        timeout=660,
    )
    assert result.returncode == 0, children.output(result)
    return json.loads(out.read_text())


SPE = ("1", "8", "32")


@pytest.mark.parametrize(
    "candidate, hand_loop",
    [
        ("CTLModel.fit, accuracy", "hand loop train step, accuracy"),
        ("CTLModel.fit", "hand loop train step, accuracy"),
        ("CTLModel.evaluate, accuracy", "hand loop eval step, accuracy"),
        ("GAN.fit", "hand GAN step"),
    ],
)
def test_at_most_the_hand_loops_collectives_per_step(counts, candidate, hand_loop):
    for spe in SPE:
        assert counts[candidate][spe] <= counts[hand_loop][spe], (spe, counts)


def test_one_devices_random_draws_add_no_collective(counts):
    # Each replica reads where its examples sit from its batch, so drawing
    # one device's numbers needs no exchange of the batch sizes.
    for spe in SPE:
        assert (
            counts["CTLModel.fit, Dropout"][spe]
            == counts["CTLModel.fit, Dropout, per-replica draws"][spe]
            == counts["CTLModel.fit"][spe]
        ), (spe, counts)


def test_one_round_trip_per_step_inside_an_execution(counts):
    # Data of known length: the gradients with the global count and the
    # logs every step, in one collective; no "has data" agreement.
    for name in ("CTLModel.fit, accuracy", "CTLModel.fit"):
        assert [counts[name][spe] for spe in SPE] == [1, 1, 1]
    for name in ("CTLModel.evaluate, accuracy", "CTLModel.evaluate"):
        assert [counts[name][spe] for spe in SPE] == [1, 1 / 8, 1 / 32]
    # Only data of unknown length asks at every step whether there is more
    # (counted with the `tf.cond` that skips the last execution's last
    # question: 1 / spe above what runs).
    unknown = [counts["CTLModel.fit, data of unknown length"][spe] for spe in SPE]
    assert unknown == [2, 2 + 1 / 8, 2 + 1 / 32]
    # The hand loops: the iterator's agreement, the gradients, the loss.
    assert counts["hand loop train step, accuracy"]["1"] == 3
    assert counts["hand loop eval step, accuracy"]["1"] == 1
    assert counts["hand GAN step"]["1"] == 4
    assert [counts["GAN.fit"][spe] for spe in SPE] == [4, 3 + 1 / 8, 3 + 1 / 32]
