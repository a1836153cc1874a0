"""The chief of a parameter-server job, for the parameter-server tests.

Usage (as the launcher's chief):
    python -m keras_ctl.launch --workers N --ps M -- \\
        python parameter_server_child.py SCENARIO OUTPUT_JSON

Scenarios: one_worker (CTLModel under the strategy and keras.Model on one
device), two_workers (callbacks, steps_per_execution, the TensorFlow
tutorial's `dataset_fn` and a repeated dataset), kill_worker (SIGKILLs
worker 1 as epoch 2 begins), ps_lost (SIGKILLs the parameter server as
epoch 2 begins, the first time), embedding (a table sharded across two
parameter servers, saved both ways), gan.
"""

import json
import os
import signal
import sys

import keras_ctl

scenario, output = sys.argv[1], sys.argv[2]
partitioner = None
if scenario == "embedding":  # the table in two shards, one per server
    import tensorflow as tf

    partitioners = tf.distribute.experimental.partitioners
    partitioner = partitioners.MinSizePartitioner(min_shard_bytes=1024, max_shards=2)
strategy = keras_ctl.strategies.parameter_server_strategy(partitioner)

import cases  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from small_classifier import compile_classifier  # noqa: E402
from small_classifier import functional  # noqa: E402
from small_classifier import small_data  # noqa: E402

result = {}


def build(model_class=keras_ctl.CTLModel, **compile_kwargs):
    return compile_classifier(functional(model_class), **compile_kwargs)


def weights(model):
    return [w.tolist() for w in model.get_weights()]


class KillServer(keras.callbacks.Callback):
    """SIGKILLs a server of the launcher's cluster as an epoch begins."""

    def __init__(self, job, index, epoch):
        super().__init__()
        self.job, self.index, self.epoch = job, index, epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            pids = json.loads(os.environ["KERAS_CTL_SERVER_PIDS"])
            os.kill(pids[self.job][self.index], signal.SIGKILL)


def fit_kwargs(**kwargs):
    x, y = small_data(37)
    return dict(x=x, y=y, batch_size=8, epochs=2, shuffle=False, verbose=0, **kwargs)


if scenario == "one_worker":
    reference = build(keras.Model)
    history = reference.fit(**fit_kwargs()).history
    x, y = small_data(37)
    result["reference"] = {
        "weights": weights(reference),
        "history": history,
        "evaluate": reference.evaluate(x, y, verbose=0),
        "predict": reference.predict(x, verbose=0).tolist(),
    }
    for name, options in (("plain", {}), ("spe2", {"steps_per_execution": 2})):
        with strategy.scope():
            model = build(**options)
        history = model.fit(**fit_kwargs()).history
        result[name] = {
            "weights": weights(model),
            "history": history,
            "evaluate": model.evaluate(x, y, verbose=0),
            "predict": model.predict(x, verbose=0).tolist(),
            "iterations": int(model.optimizer.iterations),
        }
    try:
        model.fit(**fit_kwargs(class_weight={0: 1.0, 1: 2.0}))
    except ValueError as error:
        result["class_weight_error"] = str(error)
    result["gan_reference"] = cases.run_gan()
    result["gan"] = cases.run_gan(strategy)
    # A loss coupling the batch: each step is one worker's whole batch.
    result["coupled_reference"] = cases.run("in_batch_negatives", keras.Model)
    result["coupled"] = cases.run("in_batch_negatives", strategy=strategy)

elif scenario == "two_workers":
    folder = os.path.dirname(output)
    x, y = small_data(200)
    with strategy.scope():
        model = build(steps_per_execution=2)
    callbacks = [
        keras.callbacks.ModelCheckpoint(os.path.join(folder, "model.keras")),
        keras.callbacks.EarlyStopping(monitor="loss", patience=5),
        keras_ctl.callbacks.BackupAndRestore(
            os.path.join(folder, "backup"), delete_checkpoint=False
        ),
    ]
    history = model.fit(x, y, batch_size=8, epochs=3, callbacks=callbacks, verbose=0)
    result["arrays"] = {
        "history": history.history,
        "iterations": int(model.optimizer.iterations),
    }

    # TensorFlow's tutorial "Parameter server training with Model.fit".
    def dataset_fn(input_context):
        global_batch_size = 16
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(200).repeat()
        dataset = dataset.shard(
            input_context.num_input_pipelines, input_context.input_pipeline_id
        )
        return dataset.batch(batch_size).prefetch(2)

    repeated = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
    for name, data in (("dataset_fn", dataset_fn), ("dataset", repeated)):
        with strategy.scope():
            model = build()
        history = model.fit(data, epochs=2, steps_per_epoch=10, verbose=0)
        result[name] = {
            "history": history.history,
            "iterations": int(model.optimizer.iterations),
        }

elif scenario in ("kill_worker", "ps_lost"):
    # ps_lost: the first run loses its parameter server in epoch 2 (a marker
    # file remembers); run again, it resumes from the epoch-1 backup.
    folder = os.path.dirname(output)
    x, y = small_data(200)
    with strategy.scope():
        model = build()
    callbacks = [keras_ctl.callbacks.BackupAndRestore(os.path.join(folder, "backup"))]
    marker = os.path.join(folder, "killed")
    if not os.path.exists(marker):
        open(marker, "w").close()
        job = "worker" if scenario == "kill_worker" else "ps"
        callbacks.append(KillServer(job, 1 if job == "worker" else 0, 1))
    try:
        history = model.fit(
            x, y, batch_size=8, epochs=3, steps_per_epoch=20, callbacks=callbacks
        )
        result["history"] = history.history
        result["iterations"] = int(model.optimizer.iterations)
    except RuntimeError as error:
        result["error"] = str(error)


elif scenario == "embedding":
    folder = os.path.dirname(output)
    ids, labels = cases.embedding_data()
    with strategy.scope():
        model = cases.embedding_model()
    table = model.get_layer("table").embeddings.value
    result["shards"] = [list(v.shape) for v in table.variables]
    history = model.fit(ids, labels, batch_size=16, epochs=3, verbose=0)
    result["loss"] = history.history["loss"]
    result["iterations"] = int(model.optimizer.iterations)
    model.save(os.path.join(folder, "embedding.keras"))
    tf.train.Checkpoint(model=model).write(os.path.join(folder, "checkpoint"))
    result["predict"] = model.predict(ids, verbose=0).tolist()

elif scenario == "gan":
    result = cases.run_gan(strategy)

with open(output, "w") as f:
    json.dump(result, f)
