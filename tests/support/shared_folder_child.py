"""One worker of a job whose workers all run the same one-machine script,
writing to one shared folder (started by keras_ctl.launch).

Usage: python shared_folder_child.py FOLDER

Trains with Keras's file-writing callbacks (ModelCheckpoint, CSVLogger,
TensorBoard, BackupAndRestore) and EarlyStopping into FOLDER/run, then
`model.save(FOLDER/run/final.keras)`, as every worker does; writes
FOLDER/worker_<index>.json with its weights and number of epochs.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_ctl import strategies  # noqa: E402

strategy = strategies.multi_worker_strategy()

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_ctl  # noqa: E402

folder = sys.argv[1]
run = os.path.join(folder, "run")
rng = np.random.default_rng(0)
x = rng.random((64, 4), dtype=np.float32)
y = (x.sum(axis=1) > 2).astype("int32")
keras.utils.set_random_seed(0)
with strategy.scope():
    inputs = keras.Input((4,))
    model = keras_ctl.CTLModel(inputs, keras.layers.Dense(2)(inputs))
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
callbacks = [
    keras.callbacks.ModelCheckpoint(
        os.path.join(run, "best.keras"), monitor="loss", save_best_only=True
    ),
    keras.callbacks.ModelCheckpoint(
        os.path.join(run, "epoch_{epoch}.weights.h5"), save_weights_only=True
    ),
    keras.callbacks.CSVLogger(os.path.join(run, "log.csv")),
    keras.callbacks.TensorBoard(os.path.join(run, "tb")),
    keras.callbacks.BackupAndRestore(os.path.join(run, "backup")),
    # No epoch improves the loss by 1: training stops after epoch 2 of 5.
    keras.callbacks.EarlyStopping(monitor="loss", min_delta=1.0, patience=1),
]
history = model.fit(x, y, batch_size=16, epochs=5, shuffle=False, callbacks=callbacks)
model.save(os.path.join(run, "final.keras"))
with open(os.path.join(folder, f"worker_{strategies.task_index()}.json"), "w") as f:
    json.dump(
        {
            "weights": [w.tolist() for w in model.get_weights()],
            "epochs": len(history.history["loss"]),
        },
        f,
    )
