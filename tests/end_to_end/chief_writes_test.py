"""The same one-machine script on 2 worker processes sharing one folder:
each file the callbacks and `model.save()` write is written once, by the
chief, and holds the trained weights; nothing else is left there."""

import json

import children
import keras
import numpy as np

import keras_ctl  # noqa: F401 (registers CTLModel for loading)


def test_two_workers_leave_one_copy_of_each_file(tmp_path):
    command = [children.PYTHON, "shared_folder_child.py", tmp_path]
    result = children.run(children.launched(2, command, timeout=300), timeout=360)
    assert result.returncode == 0, children.output(result)
    # Only the chief prints its progress bar.
    assert result.stdout.count("Epoch 1/5") == 1, result.stdout

    workers = [json.loads((tmp_path / f"worker_{i}.json").read_text()) for i in (0, 1)]
    # EarlyStopping decides on the same logs on every worker.
    assert [w["epochs"] for w in workers] == [2, 2]
    trained = [np.array(w) for w in workers[0]["weights"]]
    for got, want in zip(workers[1]["weights"], trained, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)

    run = tmp_path / "run"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "run",
        "worker_0.json",
        "worker_1.json",
    ]
    assert sorted(p.name for p in run.iterdir()) == [
        "best.keras",
        "epoch_1.weights.h5",
        "epoch_2.weights.h5",
        "final.keras",
        "log.csv",
        "tb",
    ]
    # One TensorBoard run: one event file.
    assert [p.name for p in (run / "tb").iterdir()] == ["train"]
    assert len(list((run / "tb" / "train").iterdir())) == 1
    assert len((run / "log.csv").read_text().splitlines()) == 1 + 2

    final = keras.saving.load_model(run / "final.keras")
    for got, want in zip(final.get_weights(), trained, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    final.load_weights(run / "epoch_2.weights.h5")
    for got, want in zip(final.get_weights(), trained, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    best = keras.saving.load_model(run / "best.keras")
    assert [w.shape for w in best.get_weights()] == [w.shape for w in trained]
