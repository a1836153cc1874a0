"""The `keras-ctl` command's arguments and run files, without training."""

import importlib.util
import json

import children
import pytest

import keras_ctl_cli
from keras_ctl.cli.common import HistoryFiles
from keras_ctl.demos import plots


def usage_error(capsys, *argv):
    with pytest.raises(SystemExit) as exit_info:
        keras_ctl_cli.main(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "gan", "--replicas", "0"], "Received: --replicas 0"),
        (["train", "gan", "--epochs", "0"], "Received: --epochs 0"),
        (["tune", "gan", "--trials", "0"], "Received: --trials 0"),
        (["launch", "--workers", "2", "--ps", "-1", "--", "x"], "Received: --ps -1"),
        (
            ["train", "gan", "--strategy", "default", "--replicas", "2"],
            "Received: --replicas 2",
        ),
        (
            ["train", "gan", "--strategy", "onedevice", "--replicas", "2"],
            "Use --strategy mirrored",
        ),
        (["train", "gan", "--strategy", "nccl"], "invalid choice: 'nccl'"),
        (["train", "gan", "--resume", "--out", "/nonexistent"], "--resume continues"),
    ],
)
def test_bad_flags_get_clear_errors(capsys, monkeypatch, argv, message):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert message in usage_error(capsys, *argv)


def test_multiworker_without_a_cluster_says_how_to_start_one(capsys, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    error = usage_error(capsys, "train", "gan", "--strategy", "multiworker")
    assert "Received: no TF_CONFIG" in error and "keras-ctl launch" in error


def test_multiworker_in_a_slurm_step_needs_no_tf_config(monkeypatch, tmp_path):
    """Under `srun`, the step's tasks are the cluster (`slurm_test.py` runs
    `multi_worker_strategy()` there, which `--strategy multiworker` calls)."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    parser = keras_ctl_cli.build_parser()
    argv = ["train", "gan", "--strategy", "multiworker", "--out", str(tmp_path)]
    args = parser.parse_args(argv)
    keras_ctl_cli._validate(parser, args)  # no usage error
    assert args.strategy == "multiworker" and args.out == str(tmp_path)


@pytest.mark.parametrize("where", ["the file", "below the file"])
def test_out_pointing_at_a_file_is_a_usage_error(capsys, tmp_path, where):
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    out = existing if where == "the file" else existing / "run"
    error = usage_error(capsys, "train", "gan", "--out", str(out))
    assert f"Received: --out {out}, but {existing} is a file" in error
    assert existing.read_text() == "mine"


def test_an_interrupted_run_is_not_overwritten(capsys, tmp_path):
    (tmp_path / "backup").mkdir()
    (tmp_path / "backup" / "latest.weights.h5").write_bytes(b"state")
    assert "Pass --resume" in usage_error(
        capsys, "train", "gan", "--out", str(tmp_path)
    )
    assert (tmp_path / "backup" / "latest.weights.h5").read_bytes() == b"state"


def test_a_finished_run_is_replaced_only_with_overwrite(capsys, tmp_path):
    (tmp_path / "model.keras").write_bytes(b"trained")
    (tmp_path / "history.json").write_text("{}")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "events.out").write_bytes(b"run 1")
    error = usage_error(capsys, "train", "classifier", "--out", str(tmp_path))
    assert "holds a finished run (history.json, model.keras)" in error
    assert "pass --overwrite" in error
    assert (tmp_path / "model.keras").read_bytes() == b"trained"
    assert (tmp_path / "logs" / "events.out").exists()
    # With --overwrite the earlier TensorBoard run goes (runs never mix).
    parser = keras_ctl_cli.build_parser()
    args = parser.parse_args(
        ["train", "classifier", "--out", str(tmp_path), "--overwrite"]
    )
    keras_ctl_cli._validate(parser, args)
    assert args.out == str(tmp_path) and not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    "argv, shown",
    [
        (["--help"], ("train", "tune", "launch")),
        (["launch", "--help"], ("--workers", "--ps", "--restarts")),
        (["launch", "--workers", "x"], ("invalid int value: 'x'",)),
    ],
)
def test_help_and_bad_flags_answer_without_starting_tensorflow(argv, shown):
    code = (
        "import sys, keras_ctl_cli\n"
        "try:\n"
        f"    keras_ctl_cli.main({argv!r})\n"
        "except SystemExit as exit:\n"
        "    print('exit', exit.code, 'tensorflow' in sys.modules)\n"
    )
    result = children.run([children.PYTHON, "-c", code], timeout=60)
    code = 2 if "x" in argv else 0
    assert f"exit {code} False" in result.stdout, children.output(result)
    for text in shown:
        assert text in result.stdout + result.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rounds", "0"], "Received: --rounds 0"),
        (["--models", "rnn"], "Received: 'rnn'"),
        (["--replicas", "2,4"], "Received: --replicas 2,4. Run once"),
        (["--replicas", "3"], "Received: '3'"),
        (["--ps-workers", "0"], "Received: '0'"),
    ],
)
def test_bad_benchmark_flags_get_clear_errors(capsys, argv, message):
    path = f"{children.ROOT}/benchmarks/bench.py"
    spec = importlib.util.spec_from_file_location("bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_history_files_keep_the_epochs_of_a_killed_run(tmp_path):
    first = HistoryFiles(tmp_path)
    for epoch in range(3):
        first.on_epoch_end(epoch, {"loss": 1.0 / (epoch + 1), "accuracy": 0.1 * epoch})
    # Killed during epoch 4; the resumed run trains epochs 4 and 5 (index 3, 4),
    # after an epoch-3 backup that was never written: epoch 3 is trained again.
    resumed = HistoryFiles(tmp_path)
    for epoch in (2, 3, 4):
        resumed.on_epoch_end(epoch, {"loss": 0.5 - 0.1 * epoch, "accuracy": 0.5})
    history = json.loads((tmp_path / "history.json").read_text())
    assert history["loss"] == pytest.approx([1.0, 0.5, 0.3, 0.2, 0.1])
    assert history["accuracy"] == pytest.approx([0.0, 0.1, 0.5, 0.5, 0.5])
    rows = (tmp_path / "history.csv").read_text().splitlines()
    assert rows[0] == "epoch,loss,accuracy"
    assert [row.split(",")[0] for row in rows[1:]] == ["1", "2", "3", "4", "5"]


def test_one_epoch_curves_have_markers_on_integer_ticks():
    figure = plots.curves_figure({"loss": [0.7], "val_loss": [0.9]})
    axis = figure.axes[0]
    ticks = [tick for tick in axis.get_xticks() if 0.5 <= tick <= 1.5]
    assert ticks == [1.0]
    assert [line.get_marker() for line in axis.get_lines()] == ["o", "o"]
    plots.pyplot().close(figure)


def test_curves_name_their_axes_and_the_run():
    figure = plots.curves_figure({"loss": [0.7, 0.5]}, "classifier: 2 replicas")
    assert figure.axes[0].get_ylabel() == "loss"
    assert figure.axes[0].get_xlabel() == "epoch"
    assert figure._suptitle.get_text() == "classifier: 2 replicas"
    plots.pyplot().close(figure)


def test_validation_is_the_last_tenth_of_the_train_split():
    import numpy as np

    from keras_ctl.cli import common

    x, y = np.arange(50), np.arange(50) * 2
    (x_fit, y_fit), (x_val, y_val) = common.validation_split(x, y)
    np.testing.assert_array_equal(x_fit, np.arange(45))
    np.testing.assert_array_equal(x_val, np.arange(45, 50))
    np.testing.assert_array_equal(y_val, np.arange(45, 50) * 2)
    assert len(y_fit) == 45


def test_learning_curves_write_a_png(tmp_path):
    plots.learning_curves({"loss": [0.7, 0.5]}, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_every_flag_says_its_default():
    import argparse

    import keras_ctl_launch

    commands = keras_ctl_cli.build_parser()._subparsers._group_actions[0].choices
    parsers = {"launch": keras_ctl_launch.build_parser()}
    parsers.update({name: commands[name] for name in ("train", "tune")})
    for name, parser in parsers.items():
        text = parser.format_help()
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            if action.required or isinstance(action, argparse._HelpAction):
                continue
            flag = action.option_strings[-1]
            assert action.help, f"{name} {flag} has no help"
            assert "default" in parser.formatter_class(name)._get_help_string(action), (
                f"{name} {flag}"
            )
        assert "(default:" in text
