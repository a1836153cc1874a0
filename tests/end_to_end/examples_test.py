"""Every example runs from a fresh interpreter and writes what it promises."""

import json
import os

import children


def run_example(script, *args, timeout=300):
    result = children.run(
        [children.PYTHON, os.path.join("examples", script), *args],
        timeout=timeout,
        cwd=children.ROOT,
    )
    assert result.returncode == 0, children.output(result)
    return result.stdout


def test_mirrored_digits_matches_one_device(tmp_path):
    out = tmp_path / "run"
    stdout = run_example("mirrored_digits.py", "--epochs", "1", "--out", str(out))
    rows = {
        row["run"]: row for row in json.loads((out / "comparison.json").read_text())
    }
    ctl = rows["CTLModel, 3 replicas"]
    assert ctl["max_weight_difference"] < 1e-5
    reference = rows["keras.Model, 1 device"]
    assert abs(ctl["test_loss"] - reference["test_loss"]) < 1e-5
    assert abs(ctl["test_accuracy"] - reference["test_accuracy"]) < 1e-5
    history = json.loads((out / "history.json").read_text())
    assert set(history) == {"loss", "accuracy"} and len(history["loss"]) == 1
    assert (out / "model.keras").stat().st_size > 10_000
    picture = (out / "weight_difference.png").read_bytes()
    assert picture.startswith(b"\x89PNG") and len(picture) > 10_000
    assert "CTLModel, 3 replicas" in stdout
    assert "an exact run ends with one device's weights" in stdout
    stock = rows["keras.Model, 3 replicas"]
    if "error" in stock:  # printed whole, as it was raised
        assert stock["error"].split(": ", 1)[1] in stdout


def test_mirrored_digits_rejects_zero_replicas():
    result = children.run(
        [children.PYTHON, "examples/mirrored_digits.py", "--replicas", 0],
        timeout=60,
        cwd=children.ROOT,
    )
    assert result.returncode == 2
    assert "Received: --replicas 0" in result.stderr


def test_dcgan_digits_writes_a_sample_grid_per_epoch(tmp_path):
    import matplotlib.image

    out = tmp_path / "gan"
    run_example("dcgan_digits.py", "--epochs", "2", "--out", str(out))
    grids = sorted(out.glob("samples_epoch_*.png"))
    assert [p.name for p in grids] == ["samples_epoch_001.png", "samples_epoch_002.png"]
    pixels = matplotlib.image.imread(grids[-1])
    assert pixels.shape[:2] == (200, 200) and pixels.std() > 0.05
    history = json.loads((out / "history.json").read_text())
    assert set(history) == {"d_loss", "g_loss"} and len(history["g_loss"]) == 2
    assert all(0.0 < value < 10.0 for value in history["d_loss"] + history["g_loss"])
    assert (out / "gan.keras").stat().st_size > 10_000


def scalar_events(logdir):
    import tensorflow as tf

    values = {}
    for path in logdir.glob("events.out.tfevents.*"):
        for record in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                values.setdefault(value.tag, []).append(event.step)
    return values


def test_trunk_and_heads_freezes_the_trunk_and_saves_it_alone(tmp_path):
    out = tmp_path / "heads"
    run_example("trunk_and_heads.py", "--epochs", "2", "--out", str(out))
    report = json.loads((out / "report.json").read_text())
    assert report["trunk_change_while_fine_tuning"] == 0.0
    assert report["parity_head_change"] > 1e-3
    # float32 round-off: the trunk predicts under the strategy, each replica
    # on its part of a batch; the reloaded one on one device.
    assert report["reloaded_trunk_feature_difference"] <= 1e-5
    assert report["class_test_accuracy"] > 0.3
    # Conv 160 + dense 32*36*16+32 from the trunk, plus a new 10-way head.
    assert report["new_model_parameters"] == 160 + 18464 + 330
    assert (out / "trunk.keras").stat().st_size > 10_000
    for phase in ("class_path", "parity_head"):
        steps = scalar_events(out / "logs" / phase)
        assert steps["loss"] == [0, 1]


def test_tune_gan_prints_every_trial_and_the_best(tmp_path):
    stdout = run_example(
        "tune_gan.py", "--trials", "2", "--epochs", "1", "--out", str(tmp_path / "tune")
    )
    trials = [line for line in stdout.splitlines() if line.startswith("trial ")]
    best = [line for line in stdout.splitlines() if line.startswith("best trial ")]
    assert len(trials) == 2 and len(best) == 1
    losses = [float(line.split("g_loss=")[1].split()[0]) for line in trials]
    assert all(0.0 < loss < 20.0 for loss in losses)
    assert float(best[0].split("g_loss=")[1].split()[0]) == min(losses)
    assert "'d_steps'" in best[0] and "'batch_size_per_replica'" in best[0]


def test_custom_training_tutorial_restores_without_a_strategy(tmp_path):
    out = tmp_path / "tutorial"
    run_example("custom_training_tutorial.py", "--epochs", "4", "--out", str(out))
    report = json.loads((out / "report.json").read_text())
    assert report["checkpoints"] == ["ckpt-2", "ckpt-4"]  # every 2 epochs
    assert report["latest_checkpoint"] == "ckpt-4"
    assert report["restored_test_accuracy"] == report["trained_test_accuracy"] > 0.3
    assert (out / "checkpoints" / "checkpoint").exists()


def test_inside_fit_spelled_out_step_equals_the_default_one(tmp_path):
    out = tmp_path / "inside"
    run_example("inside_fit.py", "--epochs", "2", "--out", str(out))
    report = json.loads((out / "report.json").read_text())
    assert report["max_weight_difference"] < 1e-6
    assert report["default_epoch_loss"][1] < report["default_epoch_loss"][0]
    assert len(report["spelled_out_last_batch_loss"]) == 2
    assert report["test_accuracy"] > 0.3
