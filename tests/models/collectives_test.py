"""Round trips per step: at most one collective more than the hand loops.

Counted in the traced step graphs under 2 worker processes
(`benchmarks/collectives.py`): deterministic, unlike a timing.
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
            children.PYTHON,
            "-m",
            "keras_ctl.launch",
            "--workers",
            2,
            "--timeout",
            240,
            "--",
            children.PYTHON,
            os.path.join(children.ROOT, "benchmarks", "collectives.py"),
            out,
        ],
        timeout=300,
    )
    assert result.returncode == 0, children.output(result)
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "candidate, hand_loop",
    [
        ("CTLModel.fit, accuracy", "hand loop train step, accuracy"),
        ("CTLModel.fit", "hand loop train step, accuracy"),
        ("CTLModel.evaluate, accuracy", "hand loop eval step, accuracy"),
        ("GAN.fit", "hand GAN step"),
    ],
)
def test_at_most_one_collective_more_than_the_hand_loop(counts, candidate, hand_loop):
    assert counts[candidate] <= counts[hand_loop] + 1, counts


def test_the_counts_of_this_release(counts):
    # The iterator's "has data" all-reduce, the gradients with the global
    # count, and the logs: as many as the hand loop (iterator, gradients,
    # loss). Evaluate needs neither count nor gradients.
    assert counts["CTLModel.fit, accuracy"] == 3
    assert counts["CTLModel.fit"] == 3
    assert counts["CTLModel.evaluate, accuracy"] == 2
    assert counts["hand loop train step, accuracy"] == 3
    assert counts["hand loop eval step, accuracy"] == 1
    assert counts["GAN.fit"] == 5 and counts["hand GAN step"] == 4
