"""Child process: the random-draw cases (`random_draws.py`) on N replicas,
or as one worker of a job (N = "worker").

Usage: python random_draws_child.py N OUTPUT_JSON DTYPE

On N replicas: writes `{case: {"reference", "as_one_device",
"per_replica"}}`, the reference being `keras.Model` (a GAN: one device)
on one device in this process. As a worker (started by the launcher):
writes `{case: as_one_device}` to OUTPUT_JSON.<task index>. The cases are
`random_draws.CASES`, and the GAN in float32 (its losses are float32).
"""

import json
import os
import sys

import devices

replicas, output, dtype = sys.argv[1:4]
if replicas == "worker":
    from keras_ctl import strategies

    strategy = strategies.multi_worker_strategy()
else:
    devices.configure_logical_cpus(int(replicas))

import cases  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import random_draws  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_ctl  # noqa: E402


def run_gan(strategy, random_draws_option):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        gan = cases.build_gan(label_noise=0.05)
        gan.compile(
            d_optimizer=keras.optimizers.Adam(3e-3),
            g_optimizer=keras.optimizers.Adam(4e-3),
            random_draws=random_draws_option,
        )
    history = gan.fit(
        cases.gan_data()[0].astype(keras.config.floatx()),
        batch_size=16,
        epochs=2,
        verbose=0,
        shuffle=False,
    )
    return [w.tolist() for w in gan.get_weights()], history.history["d_loss"]


def run(case, base, strategy, option):
    if case == "gan":
        return run_gan(strategy, option)
    return random_draws.run(case, base, strategy, random_draws=option)


keras.config.set_floatx(dtype)  # float64 tells logic from round-off
names = (*random_draws.CASES, "gan") if dtype == "float32" else random_draws.CASES
if replicas == "worker":
    results = {
        case: run(case, keras_ctl.CTLModel, strategy, "as_one_device") for case in names
    }
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    output = f"{output}.{index}"
else:
    one_device = tf.distribute.get_strategy()
    strategy = tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(int(replicas))]
    )
    results = {}
    for case in names:
        if case == "gan":
            reference = run_gan(one_device, "as_one_device")
        else:
            reference = random_draws.run(case, keras.Model, one_device)
        results[case] = {
            "reference": reference,
            **{
                option: run(case, keras_ctl.CTLModel, strategy, option)
                for option in ("as_one_device", "per_replica")
            },
        }
with open(output, "w") as f:
    json.dump(results, f, default=lambda value: np.asarray(value).tolist())
