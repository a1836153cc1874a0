"""Steps/s of `CTLModel.fit` under `ParameterServerStrategy`, as the chief
of a local cluster:

    keras-ctl launch --workers N --ps 1 -- \
        python benchmarks/parameter_servers.py OUT.json [--rounds 5] [--steps 50]

Trains the guide's MLP (global batch 64, Adam, accuracy metric) for a
warm-up epoch that traces the step, then `--rounds` epochs of `--steps`
steps, and writes `{"workers": N, "steps_per_s": median}` to OUT.json.
"""

import argparse
import json
import os
import statistics
import sys
import time


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args(argv)

    from keras_ctl import strategies

    strategy = strategies.parameter_server_strategy()

    import keras
    import numpy as np

    from keras_ctl.demos import models
    from keras_ctl.model import CTLModel

    batch = 64
    rng = np.random.default_rng(0)
    x = rng.random((args.steps * batch, 784), dtype=np.float32)
    y = rng.integers(0, 10, args.steps * batch).astype("int32")
    with strategy.scope():
        model = models.guide_mlp(CTLModel)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0)  # traces the step
    rates = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
        rates.append(args.steps / (time.perf_counter() - start))
    workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
    with open(args.out, "w") as f:
        json.dump({"workers": workers, "steps_per_s": statistics.median(rates)}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
