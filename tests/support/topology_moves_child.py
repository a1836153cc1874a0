"""Child process: one phase of the generated topology moves on N replicas.

Usage: python topology_moves_child.py PHASE N MOVES_JSON FOLDER

PHASE "before": trains each move whose `before` is N to its stop, leaving
its backup in FOLDER. PHASE "after": resumes each move whose `after` is N
and writes FOLDER/<name>.json; with N = 1 it also writes the uninterrupted
runs, FOLDER/reference.json (see `topology_moves.py`).
"""

import json
import os
import sys

import devices

phase, replicas, moves, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
devices.configure_logical_cpus(max(replicas, 1))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
import topology_moves  # noqa: E402

keras.config.set_floatx("float64")  # tells logic from round-off

if replicas == 1:
    strategy = tf.distribute.get_strategy()
else:
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
with open(moves) as f:
    moves = json.load(f)

if phase == "before":
    for move in moves:
        if move["before"] == replicas:
            topology_moves.run_before(move, strategy, folder)
else:
    for move in moves:
        if move["after"] == replicas:
            resumed = topology_moves.run_after(move, strategy, folder)
            topology_moves.save(os.path.join(folder, move["name"] + ".json"), resumed)
    if replicas == 1:
        references = {}
        for move in moves:
            key = topology_moves.reference_key(move)
            if key not in references:
                references[key] = topology_moves.run_reference(move, strategy)
        topology_moves.save(os.path.join(folder, "reference.json"), references)
