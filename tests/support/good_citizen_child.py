"""Runs every public keras_ctl call path on 2 replicas and prints, as JSON,
what of Keras differed after each (it must be nothing) and whether
keras_ctl's replacements were in place during it (they must be).

The attributes checked are every function and class attribute of every
Keras module, NumPy's, and TensorFlow's distribution modules, plus every
owner that keras_ctl's inventory of private names and its table of
replacements name (read from the code, not a hand list).

Usage: python good_citizen_child.py
"""

import json
import sys
import threading

import devices

devices.configure_logical_cpus()

import cases  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_ctl  # noqa: E402
from keras_ctl import _keras  # noqa: E402

CHECKED_PREFIXES = ("keras", "numpy", "tensorflow.python.distribute")


def owners():
    """The modules and classes the inventory and the replacements name."""
    found = [owner for owner, _ in _keras.replaced()]
    for kind, where, name in _keras.names.inventory():
        if kind == "module":
            found.append(_keras.names.module(where))
        elif kind == "member":
            member = _keras.names.member(where, name)
            if isinstance(member, type):
                found.append(member)
    return found


def snapshot():
    seen = {}

    def add(prefix, value):
        if callable(value) or isinstance(value, (property, staticmethod)):
            seen[prefix] = id(value)

    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(CHECKED_PREFIXES):
            continue
        for attr, value in list(vars(module).items()):
            add(f"{name}.{attr}", value)
            if isinstance(value, type) and value.__module__ == name:
                for key, member in list(vars(value).items()):
                    add(f"{name}.{attr}.{key}", member)
    for owner in owners():
        label = getattr(owner, "__qualname__", getattr(owner, "__name__", ""))
        for key, member in list(vars(owner).items()):
            seen[
                f"owner:{owner.__module__ if isinstance(owner, type) else ''}"
                f".{label}.{key}"
            ] = id(member)
    return seen


def changed(before, after):
    keys = set(before) | {k for k in after if k.rsplit(".", 1)[0] in before}
    return sorted(k for k in keys if before.get(k) != after.get(k))


KERAS_CALL = keras.Layer.__call__
rng = np.random.default_rng(0)
x = rng.random((37, 6)).astype("float32")
y = rng.integers(0, 3, 37)
strategy = devices.get("mirrored")


def classifier(cls=keras_ctl.CTLModel):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = cls(inputs, keras.layers.Dense(3)(hidden))
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


# A step of one's own: the keras.io guide's, as written.
OwnStep = cases.keras_io_guide_model(keras_ctl.CTLModel, "train_step")


class Watch(keras.callbacks.Callback):
    """Notes whether the replacements are in place during the call, and
    raises or stops where asked."""

    def __init__(self, raises=None, stops=False):
        super().__init__()
        self.raises, self.stops, self.in_place = raises, stops, []

    def on_train_batch_end(self, batch, logs=None):
        self.in_place.append(keras.Layer.__call__ is not KERAS_CALL)
        if self.raises is not None:
            raise self.raises
        if self.stops:
            self.model.stop_training = True

    on_test_batch_end = on_predict_batch_end = on_train_batch_end


def plain_predictions_inside():
    """A plain keras.Model's predictions made inside a CTLModel's fit (a
    callback) equal those made outside it."""
    plain = classifier(keras.Model)
    outside = plain.predict(x, verbose=0)
    inside = []

    class Nested(Watch):
        def on_epoch_end(self, epoch, logs=None):
            inside.append(plain.predict(x, verbose=0))

    with strategy.scope():
        model = classifier()
    watch = Nested()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[watch])
    return watch, float(np.max(np.abs(inside[0] - outside)))


def gan():
    with strategy.scope():
        discriminator = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
        generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(6)])
        model = keras_ctl.GAN(discriminator, generator, latent_dim=2)
        model.compile(d_optimizer="sgd", g_optimizer="sgd")
    watch = Watch()
    model.fit(x, batch_size=8, epochs=1, verbose=0, callbacks=[watch])
    return watch


def path(name, run, results, before):
    """Runs one call path; records what changed after it and whether the
    replacements were in place during it."""
    outcome = "returned"
    try:
        watch = run()
    except (ValueError, KeyboardInterrupt) as error:
        outcome, watch = type(error).__name__, getattr(error, "watch", None)
    extra = None
    if isinstance(watch, tuple):
        watch, extra = watch
    results[name] = {
        "outcome": outcome,
        "changed": changed(before, snapshot()),
        "in_place": bool(watch and watch.in_place and all(watch.in_place)),
        "extra": extra,
    }


def fitted(callback, cls=keras_ctl.CTLModel, **kwargs):
    def run():
        with strategy.scope():
            model = classifier(cls)
        try:
            model.fit(
                x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback], **kwargs
            )
        except (ValueError, KeyboardInterrupt) as error:
            error.watch = callback
            raise
        return callback

    return run


def other_calls():
    with strategy.scope():
        model = classifier()
    watch = Watch()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    model.evaluate(x, y, batch_size=8, verbose=0, callbacks=[watch])
    model.predict(x, batch_size=8, verbose=0, callbacks=[watch])
    model.train_on_batch(x[:8], y[:8])
    model.test_on_batch(x[:8], y[:8])
    model.predict_on_batch(x[:8])
    model.get_weights()
    return watch


def plain_beside_a_thread():
    """A plain keras.Model trained while a CTLModel trains in another thread
    equals the same plain run alone."""

    def plain_run(watch=None):
        model = classifier(keras.Model)
        model.fit(
            x,
            y,
            batch_size=4,
            epochs=3,
            verbose=0,
            shuffle=False,
            callbacks=[watch] if watch else [],
        )
        return [w.numpy() for w in model.weights]

    alone = plain_run()
    with strategy.scope():
        ctl = classifier()
    done = threading.Event()

    def train_ctl():
        while not done.is_set():
            ctl.fit(x, y, batch_size=8, epochs=1, verbose=0)

    thread = threading.Thread(target=train_ctl)
    thread.start()
    beside = Watch()
    try:
        # Until the CTLModel's replacements were in place for a batch of
        # the plain run.
        for _ in range(20):
            beside.in_place.clear()
            weights = plain_run(beside)
            if any(beside.in_place):
                break
    finally:
        done.set()
        thread.join()
    overlapped = any(beside.in_place)
    beside.in_place = [overlapped]
    difference = max(float(np.max(np.abs(a - b))) for a, b in zip(alone, weights))
    return beside, difference


def main():
    results = {}
    before = snapshot()
    path("fit", fitted(Watch(), validation_data=(x, y)), results, before)
    path("fit raising", fitted(Watch(raises=ValueError("stop"))), results, before)
    path("fit interrupted", fitted(Watch(raises=KeyboardInterrupt())), results, before)
    path("fit stopped by a callback", fitted(Watch(stops=True)), results, before)
    path("own train_step", fitted(Watch(), cls=OwnStep), results, before)
    path("evaluate, predict, *_on_batch, get_weights", other_calls, results, before)
    path("GAN", gan, results, before)
    path("plain predict inside a fit", plain_predictions_inside, results, before)
    path("plain fit beside a thread", plain_beside_a_thread, results, before)
    print(json.dumps({"checked": len(before), "paths": results}))


if __name__ == "__main__":
    main()
