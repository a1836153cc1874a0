"""Kills one training run again and again, at random moments, with SIGKILL,
restarting it each time from its backup (a backup after every batch), until
a run ends; then compares the weights with an uninterrupted run's.

Usage: python kill_chain.py FOLDER [--kills N] [--seed S]

Prints one JSON line: the kills made, how many of them left a backup write
half done (a temporary file in the backup folder), and the largest
difference from the uninterrupted run. A wrong pairing of weights and
position at any restart would train some batches twice or not at all.
"""

import argparse
import json
import os
import pathlib
import random
import sys
import time

import children
import numpy as np

# Enough batches for the kills: 100 epochs of 10 batches.
EPOCHS = 100
STARTUP_TIMEOUT_S = 120
RUN_TIMEOUT_S = 600


def config(folder, **extra):
    return {
        "model": "ctl",
        "strategy": "default",
        "callback": "keras_ctl",
        "save_freq": 1,
        "kill": None,
        "marker": str(folder / "unused"),
        "backup_dir": str(folder / "backup"),
        "output": str(folder / "weights"),
        "epochs": EPOCHS,
        **extra,
    }


def command(run_config):
    return [children.PYTHON, "resume_child.py", json.dumps(run_config)]


def weights(path):
    with open(f"{path}.0") as f:
        return [np.array(w) for w in json.load(f)["weights"]]


def killed_once(run_config, rng, started):
    """Starts the run and SIGKILLs it at a random moment of its training;
    returns `None`, or the finished run's result if it ended first."""
    if started.exists():
        started.unlink()
    process = children.start(command(run_config))
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not started.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                return children.finish(process, 1)
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.6))
        if process.poll() is not None:
            return children.finish(process, 1)
    finally:
        children.stop(process)
    process.communicate()
    return None


def chain(folder, kills, seed):
    folder = pathlib.Path(folder)
    rng = random.Random(seed)
    reference = config(folder / "reference")
    (folder / "reference").mkdir(parents=True)
    result = children.run(command(reference), timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, children.output(result)

    (folder / "chain").mkdir()
    run_config = config(folder / "chain", started=str(folder / "chain" / "started"))
    backup = pathlib.Path(run_config["backup_dir"])
    made = mid_write = 0
    while made < kills:
        finished = killed_once(run_config, rng, pathlib.Path(run_config["started"]))
        if finished is not None:
            break
        made += 1
        if backup.exists():
            mid_write += any("saving" in p.name for p in backup.iterdir())
    if finished is None:
        finished = children.run(command(run_config), timeout=RUN_TIMEOUT_S)
    assert finished.returncode == 0, children.output(finished)
    got, want = weights(run_config["output"]), weights(reference["output"])
    largest = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))
    return {"kills": made, "mid_write": mid_write, "largest_difference": largest}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if os.path.isdir(args.folder) and os.listdir(args.folder):
        sys.exit(f"Expected an empty folder. Received: folder={args.folder!r}.")
    print(json.dumps(chain(args.folder, args.kills, args.seed)))


if __name__ == "__main__":
    main()
