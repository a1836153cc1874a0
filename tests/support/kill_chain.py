"""Kills one training run again and again, at random moments, with SIGKILL,
restarting it each time from its backup (a backup after every batch), until
a run ends; then compares the weights with an uninterrupted run's on one
device.

Usage: python kill_chain.py FOLDER [--kills N] [--seed S]
    [--topologies default,mirrored2,workers2]

Each start draws its topology from `--topologies` (default: one device):
"default" (one device), "mirrored2" (2 replicas), "workers2" (2 worker
processes, started by `keras_ctl.launch`). Prints one JSON line: the kills
made, how many of them left a backup write half done (a temporary file in
the backup folder), how many restarts changed the topology, and the
largest difference from the uninterrupted run. A wrong pairing of weights
and position at any restart would train some batches twice or not at all.
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


TOPOLOGIES = {"default": ("default", None), "mirrored2": ("mirrored2", None)}
TOPOLOGIES["workers2"] = ("multiworker", 2)


def command(run_config, topology="default"):
    strategy, workers = TOPOLOGIES[topology]
    child = [
        children.PYTHON,
        "resume_child.py",
        json.dumps({**run_config, "strategy": strategy}),
    ]
    if workers is None:
        return child
    return children.launched(workers, child, timeout=RUN_TIMEOUT_S)


def weights(path):
    with open(f"{path}.0") as f:
        return [np.array(w) for w in json.load(f)["weights"]]


def killed_once(run_config, rng, started, topology):
    """Starts the run on `topology` and SIGKILLs it (its process group) at a
    random moment of its training; returns `None`, or the finished run's
    result if it ended first."""
    if started.exists():
        started.unlink()
    process = children.start(command(run_config, topology))
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


def chain(folder, kills, seed, topologies=("default",)):
    # Steps on other topologies round otherwise (float32 round-off grows
    # over the run's 1000 steps): float64 tells a wrong position from it.
    floatx = "float32" if set(topologies) == {"default"} else "float64"
    folder = pathlib.Path(folder)
    rng = random.Random(seed)
    reference = config(folder / "reference", floatx=floatx)
    (folder / "reference").mkdir(parents=True)
    result = children.run(command(reference), timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, children.output(result)

    (folder / "chain").mkdir()
    run_config = config(
        folder / "chain", started=str(folder / "chain" / "started"), floatx=floatx
    )
    backup = pathlib.Path(run_config["backup_dir"])
    made = mid_write = changes = 0
    topology = previous = rng.choice(topologies)
    while made < kills:
        started = pathlib.Path(run_config["started"])
        finished = killed_once(run_config, rng, started, topology)
        if finished is not None:
            break
        made += 1
        if backup.exists():
            mid_write += any("saving" in p.name for p in backup.iterdir())
        previous, topology = topology, rng.choice(topologies)
        changes += topology != previous
    if finished is None:
        finished = children.run(command(run_config, topology), timeout=RUN_TIMEOUT_S)
    assert finished.returncode == 0, children.output(finished)
    got, want = weights(run_config["output"]), weights(reference["output"])
    largest = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))
    return {
        "kills": made,
        "mid_write": mid_write,
        "topology_changes": changes,
        "largest_difference": largest,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--topologies", default="default")
    args = parser.parse_args()
    if os.path.isdir(args.folder) and os.listdir(args.folder):
        sys.exit(f"Expected an empty folder. Received: folder={args.folder!r}.")
    topologies = tuple(args.topologies.split(","))
    unknown = [t for t in topologies if t not in TOPOLOGIES]
    if unknown:
        sys.exit(
            f"Expected --topologies among {sorted(TOPOLOGIES)}. Received: "
            f"--topologies={args.topologies!r}."
        )
    print(json.dumps(chain(args.folder, args.kills, args.seed, topologies)))


if __name__ == "__main__":
    main()
