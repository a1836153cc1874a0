"""One run of the parity kit (`keras_ctl.testing`), in its own process.

Usage: python -m keras_ctl._parity_child JOB_PICKLE REPLICAS RESULT_PICKLE
"""

import importlib
import importlib.util
import os
import pickle
import sys


def _load_build(module_name, path, qualname):
    if module_name == "__main__":
        # The caller's script: load its definitions under another name (its
        # `if __name__ == "__main__":` part does not run).
        spec = importlib.util.spec_from_file_location("_parity_build", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"Cannot load the module of `build` from {path!r}.")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    function = module
    for part in qualname.split("."):
        function = getattr(function, part)
    return function


def main(argv):
    job_path, replicas, out = argv[0], int(argv[1]), argv[2]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from keras_ctl import strategies

    # Devices first: before TensorFlow starts.
    strategy = strategies.local_mirrored_strategy(replicas) if replicas > 1 else None
    import keras
    import numpy as np
    import tensorflow as tf

    with open(job_path, "rb") as f:
        job = pickle.load(f)
    if job["floatx"]:
        keras.config.set_floatx(job["floatx"])
    strategy = strategy or tf.distribute.get_strategy()
    build = _load_build(*job["build"])
    keras.utils.set_random_seed(job["seed"])
    with strategy.scope():
        model = build()
    x, y = job["x"], job["y"]
    history = model.fit(
        x,
        y,
        batch_size=job["batch_size"],
        epochs=job["epochs"],
        shuffle=False,
        verbose=0,
        **job["fit_kwargs"],
    ).history
    evaluation = model.evaluate(
        x, y, batch_size=job["batch_size"], verbose=0, return_dict=True
    )
    from keras_ctl.testing import known_to_differ

    # The first batch, to measure a `compute_loss` of the model's own.
    batch = None
    if job["batch_size"] >= 2:
        batch = keras.tree.map_structure(
            lambda a: None if a is None else a[: job["batch_size"]],
            (x, y, job["fit_kwargs"].get("sample_weight")),
        )
    result = {
        "known_to_differ": known_to_differ(model, batch),
        "weights": [np.asarray(w) for w in model.get_weights()],
        "history": {k: np.asarray(v, dtype=np.float64) for k, v in history.items()},
        "evaluate": {k: float(v) for k, v in evaluation.items()},
    }
    with open(out, "wb") as f:
        pickle.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
