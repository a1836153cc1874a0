"""The `keras-ctl` command: its arguments, checked before TensorFlow starts.

keras-ctl train classifier --strategy mirrored --replicas 2 --epochs 3
keras-ctl train gan --epochs 30
keras-ctl tune gan --trials 4
keras-ctl launch --workers 2 -- keras-ctl train classifier --strategy multiworker

This module stands beside the `keras_ctl` package, not in it: importing
`keras_ctl` imports Keras and TensorFlow (it registers its classes with
Keras, so that `keras.models.load_model` finds them), which takes seconds
and prints TensorFlow's log lines. Here, `keras-ctl --help` and a bad flag
answer at once; the commands themselves live in `keras_ctl.cli` and are
imported only when one runs.
"""

import argparse
import datetime
import functools
import os
import pathlib
import shutil
import sys

from keras_ctl_launch import DefaultsShown

TASKS = ("classifier", "gan", "multihead")
STRATEGIES = ("auto", "default", "onedevice", "mirrored", "multiworker")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-ctl", description="Exact custom training loops for Keras."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    subcommand = functools.partial(commands.add_parser, formatter_class=DefaultsShown)

    train = subcommand(
        "train",
        help="train a model and write its files",
        description="Train a demo model and write its history, pictures and "
        "model file to --out.",
    )
    train.add_argument(
        "task",
        choices=TASKS,
        help="classifier: the tutorial's CNN; gan: a small DCGAN; multihead: "
        "a trunk and a class head, then a parity head on the frozen trunk",
    )
    _add_common(train)
    train.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="auto",
        help="tf.distribute strategy; auto: mirrored for --replicas > 1, else "
        "the default strategy (default: auto)",
    )
    train.add_argument(
        "--batch-size", type=int, default=32, help="examples per replica and step"
    )
    train.add_argument(
        "--mixed-precision",
        action="store_true",
        help="mixed_float16 on GPUs, mixed_bfloat16 on CPUs",
    )
    train.add_argument(
        "--seed", type=int, default=0, help="seed of the initial weights and shuffling"
    )
    train.add_argument(
        "--resume", action="store_true", help="continue the interrupted run in --out"
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the files of a finished run in --out",
    )

    tune = subcommand(
        "tune",
        help="search hyperparameters with keras-tuner",
        description="Random search of the hyperparameters a custom step uses.",
    )
    tune.add_argument("task", choices=("classifier", "gan"), help="the model to tune")
    _add_common(tune)
    tune.add_argument("--trials", type=int, default=4, help="trials of the search")

    commands.add_parser(
        "launch",
        help="run a command as N local workers: launch --workers N -- COMMAND",
        add_help=False,
    )
    return parser


def _add_common(parser):
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="replicas of a MirroredStrategy: GPUs, or logical CPUs without them",
    )
    parser.add_argument("--epochs", type=int, default=3, help="epochs to train")
    parser.add_argument(
        "--dataset",
        choices=("digits", "fashion_mnist", "mnist"),
        default="digits",
        help="digits ships with scikit-learn; the others download",
    )
    parser.add_argument("--out", help="output folder (default: a new one under runs/)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["launch"]:
        # The launcher's own flags and the worker command pass through as-is.
        import keras_ctl_launch

        return keras_ctl_launch.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    _validate(parser, args)
    if args.command == "train":
        from keras_ctl.cli import train

        return train.run(args)
    from keras_ctl.cli import tune

    return tune.run(args)


def _validate(parser, args):
    for flag in ("replicas", "epochs", "batch_size", "trials"):
        value = getattr(args, flag, 1)
        if isinstance(value, int) and value < 1:
            name = "--" + flag.replace("_", "-")
            parser.error(f"{name} must be >= 1. Received: {name} {value}")
    strategy = getattr(args, "strategy", "mirrored")
    # The tasks of an `srun` step are a cluster too (keras_ctl.distribute.slurm).
    in_cluster = os.environ.get("TF_CONFIG") or "SLURM_STEP_ID" in os.environ
    if strategy == "multiworker" and not in_cluster:
        parser.error(
            "--strategy multiworker needs a cluster in TF_CONFIG or a Slurm step. "
            "Received: no TF_CONFIG, and no SLURM_STEP_ID. Start it with "
            "`keras-ctl launch --workers N -- keras-ctl train ... --strategy "
            "multiworker`, with `srun -n N keras-ctl train ... --strategy "
            "multiworker` under Slurm, or set TF_CONFIG on each machine."
        )
    if strategy in ("default", "onedevice") and args.replicas != 1:
        parser.error(
            f"--strategy {strategy} has one replica. Received: --replicas "
            f"{args.replicas}. Use --strategy mirrored (or auto) for several "
            "replicas."
        )
    run_dir = _output_folder(parser, args.out or _new_run_dir(args))
    interrupted = pathlib.Path(run_dir).is_dir() and any(
        path.name.startswith("backup") for path in pathlib.Path(run_dir).iterdir()
    )
    if getattr(args, "resume", False):
        if not args.out or not interrupted:
            parser.error(
                "--resume continues an interrupted run. Received: --out "
                f"{args.out} without a backup in it. Pass the --out of that run."
            )
    elif interrupted:
        parser.error(
            f"--out {run_dir} holds an interrupted run. Pass --resume to continue "
            "it, or choose another --out (nothing is overwritten)."
        )
    elif args.command == "train" and _finished_run(run_dir):
        if not args.overwrite:
            parser.error(
                f"--out {run_dir} holds a finished run "
                f"({', '.join(_finished_run(run_dir))}). Choose another --out, "
                "or pass --overwrite to replace its files."
            )
        # One TensorBoard run per folder: the earlier run's events go.
        shutil.rmtree(os.path.join(run_dir, "logs"), ignore_errors=True)
    args.out = run_dir


def _finished_run(run_dir):
    """The names of the files a finished `train` run left in `run_dir`."""
    folder = pathlib.Path(run_dir)
    if not folder.is_dir():
        return []
    return sorted(
        path.name
        for path in folder.iterdir()
        if path.suffix == ".keras" or path.name.startswith("history")
    )


def _output_folder(parser, path):
    """`path` when it is a folder or can become one; else a usage error."""
    blocker = pathlib.Path(path)
    while not blocker.exists() and blocker != blocker.parent:
        blocker = blocker.parent
    if blocker.exists() and not blocker.is_dir():
        parser.error(
            f"--out must be a folder. Received: --out {path}, but {blocker} is "
            "a file. Choose another --out."
        )
    return str(path)


def _new_run_dir(args):
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = "-".join(filter(None, (args.command, getattr(args, "task", None), stamp)))
    return os.path.join("runs", name)


if __name__ == "__main__":
    sys.exit(main())
