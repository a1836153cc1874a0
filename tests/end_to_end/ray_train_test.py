"""The Ray Train recipe (`examples/ray_train.py`): a CTLModel trained by
Ray's `TensorflowTrainer` on a local cluster of 2 workers (127.0.0.1 only),
one of which dies mid-run; Ray starts the workers again and the run resumes
from the backup, ending with one device's weights."""

import json
import os

import children


def test_ray_train_resumes_after_a_worker_dies_and_equals_one_device(tmp_path):
    result = children.run(
        [
            children.PYTHON,
            os.path.join("examples", "ray_train.py"),
            "--out",
            tmp_path,
            "--fail-once",
        ],
        timeout=400,
        cwd=children.ROOT,
    )
    assert result.returncode == 0, children.output(result)
    report = json.loads((tmp_path / "result.json").read_text())
    assert report["max_weight_difference_from_one_device"] <= 1e-5
    assert report["worker_failed_and_resumed"]
    # Killed after 3 batches of epoch 2 (6 an epoch), backups every 2: the
    # last start trained the 4 batches left of epoch 2 and epoch 3.
    assert report["batches_per_epoch"] == 6
    assert report["batches_trained_since_the_last_start"] == 4 + 6
    # The chief's checkpoint, reported through Ray, holds the model.
    assert os.path.exists(os.path.join(report["checkpoint"], "model.keras"))
    assert (tmp_path / "model.keras").stat().st_size > 10_000
