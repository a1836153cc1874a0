"""CTLModel: save/load, drop-in conversion, custom steps, bad input."""

import warnings

import cases
import devices
import keras
import numpy as np
import pytest
import tensorflow as tf
from small_classifier import ATOL
from small_classifier import assert_weights_equal
from small_classifier import compile_classifier
from small_classifier import functional
from small_classifier import small_data

import keras_ctl


@keras.saving.register_keras_serializable(package="tests")
class TwoLayer(keras_ctl.CTLModel):
    def __init__(self, units=8, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.out = keras.layers.Dense(2)

    def call(self, x):
        return self.out(self.hidden(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@pytest.mark.parametrize("build", ["functional", "subclassed"])
def test_save_and_load_round_trip(build, tmp_path):
    x, y = small_data()
    model = functional() if build == "functional" else TwoLayer()
    compile_classifier(model, keras.optimizers.Adam(1e-2))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    assert path.stat().st_size > 0
    assert isinstance(loaded, keras_ctl.CTLModel)
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6
    )
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == 5
    # Training goes on identically from the restored optimizer state.
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert_weights_equal(loaded, model)


@keras.saving.register_keras_serializable(package="tests")
class PlainSubclassed(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(2, kernel_initializer="ones")

    def call(self, x):
        return self.dense(x)


def make_original(kind):
    if kind == "functional":
        return functional(keras.Model)
    if kind == "sequential":
        return keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dense(2),
            ]
        )
    model = PlainSubclassed()
    model(np.zeros((1, 4), "float32"))
    return model


@pytest.mark.parametrize("kind", ["functional", "sequential", "subclassed"])
def test_from_model_shares_layers_and_weight_files(kind, tmp_path):
    original = make_original(kind)
    before = [w.copy() for w in original.get_weights()]
    ctl = keras_ctl.CTLModel.from_model(original)
    assert isinstance(ctl, keras_ctl.CTLModel)
    assert ctl is original  # converted in place, whatever the kind
    assert keras_ctl.CTLModel.from_model(ctl) is ctl
    # Weights saved from the original load into the CTLModel and back.
    original.save_weights(tmp_path / "original.weights.h5")
    ctl.set_weights([np.zeros_like(w) for w in before])
    np.testing.assert_allclose(original.get_weights()[0], 0.0)  # shared
    ctl.load_weights(tmp_path / "original.weights.h5")
    for got, want in zip(ctl.get_weights(), before, strict=True):
        np.testing.assert_allclose(got, want)
    # Training the CTLModel moves the original's variables.
    x, y = small_data()
    compile_classifier(ctl).fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert not np.allclose(original.get_weights()[0], before[0])
    ctl.save_weights(tmp_path / "ctl.weights.h5")
    original.set_weights(before)
    original.load_weights(tmp_path / "ctl.weights.h5")
    assert_weights_equal(original, ctl)


@pytest.mark.parametrize(
    "kind, own_class",
    [
        ("functional", keras.Model),
        ("sequential", keras.Sequential),
        ("subclassed", PlainSubclassed),
    ],
)
def test_a_converted_model_saves_and_loads_converted(kind, own_class, tmp_path):
    x, y = small_data()
    model = compile_classifier(keras_ctl.CTLModel.from_model(make_original(kind)))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    model.save(tmp_path / "converted.keras")
    loaded = keras.models.load_model(tmp_path / "converted.keras")  # safe mode
    assert isinstance(loaded, keras_ctl.CTLModel) and isinstance(loaded, own_class)
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6
    )


def test_from_model_rejects_non_models():
    with pytest.raises(TypeError, match=r"Received: model=.*Dense"):
        keras_ctl.CTLModel.from_model(keras.layers.Dense(2))


class KerasIoStep(keras_ctl.CTLModel):
    """A custom step written as in the keras.io guide, only the base changed."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        for metric in self.metrics:
            if metric.name != "loss":
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def fit_on(strategy, model_fn, x, y, metrics=("accuracy",), **fit_kwargs):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = model_fn()
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=list(metrics) or None,
        )
    history = model.fit(x, y, shuffle=False, verbose=0, **fit_kwargs).history
    return model, history


@pytest.mark.slow  # for the fast tier's time; the suite runs it
def test_keras_io_train_step_is_exact_under_mirrored():
    x, y = small_data(101)
    ref, ref_history = fit_on(
        devices.get("default"), functional, x, y, batch_size=16, epochs=2
    )
    got, history = fit_on(
        devices.get("mirrored"),
        lambda: functional(KerasIoStep),
        x,
        y,
        batch_size=16,
        epochs=2,
    )
    assert_weights_equal(got, ref)
    np.testing.assert_allclose(history["accuracy"], ref_history["accuracy"], atol=ATOL)


class BuildingBlocksStep(keras_ctl.CTLModel):
    """A custom step made of the public building blocks."""

    @keras_ctl.written_in_shares
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            regularization = keras_ctl.scaled_regularization_loss(self.losses)
            per_example = keras.losses.sparse_categorical_crossentropy(
                y, y_pred, from_logits=True
            )
            loss = keras_ctl.global_mean(per_example) + regularization
        keras_ctl.minimize(loss, self.trainable_variables, self.optimizer, tape)
        hits = tf.cast(
            tf.equal(tf.argmax(y_pred, -1, output_type=tf.int32), y), "float32"
        )
        return {
            "step_loss": keras_ctl.ReplicaSum(loss),
            "step_accuracy": keras_ctl.ExampleMean(
                tf.reduce_sum(hits), tf.cast(tf.size(hits), "float32")
            ),
            "lr": keras_ctl.Synchronized(self.optimizer.learning_rate),
        }


def test_building_blocks_step_is_exact_under_mirrored():
    x, y = small_data(101)
    runs = {
        kind: fit_on(
            devices.get(kind),
            lambda: functional(BuildingBlocksStep),
            x,
            y,
            metrics=(),
            batch_size=16,
            epochs=2,
        )
        for kind in ("default", "mirrored")
    }
    (ref, ref_history), (got, history) = runs["default"], runs["mirrored"]
    assert_weights_equal(got, ref)
    assert history.keys() == {"step_loss", "step_accuracy", "lr"}
    for key in history:
        np.testing.assert_allclose(
            history[key], ref_history[key], atol=ATOL, err_msg=key
        )
    np.testing.assert_allclose(history["lr"], 0.1, atol=1e-7)
    # The last batch holds 5 of 101 examples: its accuracy is over 5.
    assert 0.0 <= history["step_accuracy"][-1] <= 1.0


@pytest.mark.parametrize("kind", ["default", "mirrored"])
def test_predict_keeps_example_order(kind):
    x, _ = small_data(23)
    keras.utils.set_random_seed(0)
    strategy = devices.get(kind)
    with strategy.scope():
        model = compile_classifier(functional())
    expected = keras.ops.convert_to_numpy(model(x))
    np.testing.assert_allclose(
        model.predict(x, batch_size=4, verbose=0), expected, atol=1e-6
    )


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("kind", ["default", "mirrored"])
def test_steps_per_execution_and_jit_compile_match_plain_steps(kind):
    x, y = small_data(101)
    strategy = devices.get(kind)
    results = []
    for options in ({}, {"steps_per_execution": 4}, {"jit_compile": True}):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = functional()
            model.compile(
                optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
                **options,
            )
        history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        results.append((model, history.history, model.evaluate(x, y, verbose=0)))
    if kind == "mirrored":
        # Each replica ran its own XLA-compiled forward and backward pass.
        assert results[2][0]._engine.train_pass.tracing_count() >= 1
    base_model, base_history, base_eval = results[0]
    for model, history, evaluation in results[1:]:
        assert_weights_equal(model, base_model)
        for key in base_history:
            np.testing.assert_allclose(history[key], base_history[key], atol=ATOL)
        np.testing.assert_allclose(evaluation, base_eval, atol=ATOL)


def test_jit_compile_falls_back_for_weight_sum_losses():
    """A loss divided by the global weight sum needs its all-reduce."""
    x, y = small_data(101)
    weights = np.linspace(0.5, 1.5, len(x)).astype("float32")
    runs = []
    for jit_compile in (False, True):
        keras.utils.set_random_seed(0)
        with devices.get("mirrored").scope():
            model = functional()
            model.compile(
                optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True, reduction="mean_with_sample_weight"
                ),
                jit_compile=jit_compile,
            )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = model.fit(
                x,
                y,
                sample_weight=weights,
                batch_size=8,
                epochs=1,
                shuffle=False,
                verbose=0,
            ).history
        runs.append((model, history))
        fell_back = [w for w in caught if "run without XLA" in str(w.message)]
        assert len(fell_back) == (1 if jit_compile else 0)
    assert_weights_equal(runs[1][0], runs[0][0])
    np.testing.assert_allclose(runs[1][1]["loss"], runs[0][1]["loss"], atol=ATOL)


def test_train_and_test_on_batch_match_keras():
    x, y = small_data(16)
    ref = compile_classifier(functional(keras.Model))
    got = compile_classifier(functional())
    for model in (ref, got):
        model.train_on_batch(x, y)
    assert_weights_equal(got, ref)
    np.testing.assert_allclose(
        got.test_on_batch(x, y), ref.test_on_batch(x, y), atol=ATOL
    )


def test_mixed_precision_scales_the_loss_under_mirrored():
    x, y = small_data(101)
    keras.config.set_dtype_policy("mixed_float16")
    try:
        with devices.get("mirrored").scope():
            model = compile_classifier(functional())
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0).history
    finally:
        keras.config.set_dtype_policy("float32")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert all(np.isfinite(history["loss"]))
    # 2 epochs x 7 steps, all finite: every step applied and counted.
    assert int(model.optimizer.iterations.numpy()) == 14
    assert float(model.optimizer.dynamic_scale.numpy()) == 2.0**15


@pytest.mark.parametrize(
    "options", [{"global_clipnorm": 0.05}, {"clipnorm": 0.02}, {"clipvalue": 0.01}]
)
def test_clipping_acts_on_the_summed_gradient(options):
    x, y = small_data(37)  # 5 steps of 8, the last split 3 + 2
    expected = compile_classifier(
        functional(keras.Model), keras.optimizers.SGD(0.5, **options)
    )
    expected.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    unclipped = compile_classifier(functional(keras.Model), keras.optimizers.SGD(0.5))
    unclipped.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    with devices.get("mirrored").scope():
        model = compile_classifier(functional(), keras.optimizers.SGD(0.5, **options))
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert_weights_equal(model, expected)
    # The clipping binds: without it the run ends elsewhere.
    gap = max(
        np.max(np.abs(a - b))
        for a, b in zip(expected.get_weights(), unclipped.get_weights())
    )
    assert gap > 1e-3


def test_mixed_precision_skips_a_step_that_overflows_on_one_replica():
    """One decision from the summed gradients: a non-finite gradient on the
    second replica only skips the step everywhere, as on one device."""
    x, _ = small_data(16)
    y = x.sum(axis=1, keepdims=True)
    y[6] = np.inf  # example 6: the second replica's half of the first batch
    runs = {}
    keras.config.set_dtype_policy("mixed_float16")
    try:
        for where in ("default", "mirrored"):
            with devices.get(where).scope():
                model = keras_ctl.CTLModel.from_model(
                    keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
                )
                model.set_weights([np.full((4, 1), 0.1), np.zeros(1)])
                model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
            model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
            runs[where] = model
    finally:
        keras.config.set_dtype_policy("float32")
    for model in runs.values():
        assert all(np.isfinite(w).all() for w in model.get_weights())
        # The first step overflowed (skipped, scale halved); the second applied.
        assert float(model.optimizer.dynamic_scale.numpy()) == 2.0**14
    # float16 sums split over replicas round differently (its step is 2e-4).
    for got, expected in zip(
        runs["mirrored"].get_weights(), runs["default"].get_weights()
    ):
        np.testing.assert_allclose(got, expected, atol=5e-4, rtol=0)


def test_fit_without_a_loss_names_the_argument():
    x, y = small_data()
    model = functional()
    model.compile(optimizer="sgd")
    with pytest.raises(
        ValueError, match=r"`loss` argument in `compile\(\)`.*Received: loss=None"
    ):
        model.fit(x, y, verbose=0)


def test_labels_that_do_not_fit_the_output_name_y():
    x, _ = small_data()
    model = functional()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(
        ValueError, match=r"Raised by loss=.* output .* y of shape \(None, 3\)"
    ):
        model.fit(x, np.zeros((len(x), 3), "float32"), verbose=0)


def test_an_error_inside_a_loss_keeps_its_own_message():
    x, y = small_data()
    model = functional()

    def picky_loss(y_true, y_pred):
        raise ValueError("picky_loss wants float labels")

    model.compile(optimizer="sgd", loss=picky_loss)
    with pytest.raises(ValueError, match=r"(?s)picky_loss wants float labels.*Raised"):
        model.fit(x, y, verbose=0)


def batch_mean_loss(y_true, y_pred):
    """A loss that reduces its batch itself: one value per replica."""
    labels = keras.ops.one_hot(keras.ops.cast(y_true, "int32"), 2)
    return keras.ops.mean(keras.ops.square(y_pred - labels))


@pytest.mark.parametrize("n", [37, 33])  # 33: a replica gets no example
def test_a_loss_returning_a_scalar_is_a_mean_over_examples(n):
    x, y = small_data(n)
    runs = {}
    for kind, model_class in (("default", keras.Model), ("mirrored", None)):
        keras.utils.set_random_seed(0)
        with devices.get(kind).scope():
            model = functional(model_class or keras_ctl.CTLModel)
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss=batch_mean_loss)
        history = model.fit(
            x, y, batch_size=4 if n == 33 else 8, epochs=2, shuffle=False, verbose=0
        )
        runs[kind] = (model, history.history["loss"], model.evaluate(x, y, verbose=0))
    (one_device, loss, evaluation), (ctl, ctl_loss, ctl_evaluation) = runs.values()
    assert_weights_equal(ctl, one_device)
    np.testing.assert_allclose(ctl_loss, loss, atol=ATOL)
    assert ctl_evaluation == pytest.approx(evaluation, abs=ATOL)


def test_a_scalar_loss_with_a_sum_reduction_is_rejected():
    x, y = small_data()
    model = functional()

    class BatchMeanLoss(keras.losses.Loss):
        def call(self, y_true, y_pred):
            return batch_mean_loss(y_true, y_pred)

    model.compile(optimizer="sgd", loss=BatchMeanLoss(reduction="sum"))
    with pytest.raises(ValueError, match=r"one value for the whole batch.*'sum'"):
        model.fit(x, y, verbose=0)


def test_cases_module_builds_every_case():
    for case in cases.INVARIANCE_CASES:
        model, fit_kwargs, _ = cases.build(case, keras_ctl.CTLModel)
        assert fit_kwargs["epochs"] == cases.EPOCHS
        assert model.count_params() > 0


@keras.saving.register_keras_serializable(package="tests")
class FunctionalStepper(keras_ctl.CTLModel):
    """A CTLModel subclass used functionally, as in the keras.io guide."""


def test_functional_use_of_a_subclass_keeps_other_subclasses_intact(tmp_path):
    bases = keras_ctl.CTLModel.__bases__
    model = functional(FunctionalStepper)
    # Keras would have rewritten CTLModel's bases to make it functional.
    assert keras_ctl.CTLModel.__bases__ == bases
    assert keras.Model in bases
    subclassed = TwoLayer()
    subclassed(np.zeros((1, 4), "float32"))
    assert len(subclassed.weights) == 4
    compile_classifier(model)
    model.save(tmp_path / "stepper.keras")
    loaded = keras.models.load_model(tmp_path / "stepper.keras", safe_mode=True)
    assert isinstance(loaded, FunctionalStepper)
    x, _ = small_data(5)
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0)
    )


class CountsTraces(keras_ctl.CTLModel):
    """Counts how often its train step is traced (Python runs at trace time)."""

    traces = 0

    def train_step(self, data):
        CountsTraces.traces += 1
        return super().train_step(data)


def test_later_epochs_and_fit_calls_reuse_the_traced_step():
    x, y = small_data(64)
    model = compile_classifier(functional(CountsTraces))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    first = model.fit(dataset, epochs=3, verbose=0).history["loss"]
    traced = CountsTraces.traces
    second = model.fit(dataset, epochs=2, verbose=0).history["loss"]
    assert 1 <= traced <= 2  # tf.function retraces once after creating variables
    assert CountsTraces.traces == traced
    # The directly called concrete function trains like one device does.
    reference = compile_classifier(functional())
    expected = reference.fit(dataset, epochs=5, verbose=0).history["loss"]
    np.testing.assert_allclose(first + second, expected, atol=ATOL)
    assert_weights_equal(model, reference)


def test_fit_opens_one_iterator_per_epoch_under_a_strategy():
    """No batch is read to build the model, and the iterator Keras opens in
    advance for a next epoch is never opened after the last one."""
    x, y = small_data(64)
    iterators = []

    def batches():
        iterators.append(1)  # runs once per iterator over the dataset
        yield from zip(x, y)

    dataset = tf.data.Dataset.from_generator(
        batches,
        output_signature=(
            tf.TensorSpec((4,), tf.float32),
            tf.TensorSpec((), tf.int32),
        ),
    ).batch(8)
    with devices.get("mirrored").scope():
        model = compile_classifier(functional())
    model.fit(dataset, epochs=2, verbose=0)
    assert len(iterators) == 2  # unbuilt: no extra read
    model.fit(dataset, epochs=2, verbose=0)
    assert len(iterators) == 4


class ReadmeStep(keras_ctl.CTLModel):
    """The building-blocks step of docs/guides/custom-step.md."""

    @keras_ctl.written_in_shares
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            reg = keras_ctl.scaled_regularization_loss(self.losses)  # read first
            per_example = keras.losses.sparse_categorical_crossentropy(
                y, y_pred, from_logits=True
            )
            loss = keras_ctl.global_mean(per_example) + reg
        keras_ctl.minimize(loss, self.trainable_variables, self.optimizer, tape)
        return {"batch_loss": keras_ctl.ReplicaSum(loss)}


def test_the_readme_step_logs_its_last_batch_loss():
    x, y = small_data(37)  # the last batch: 5 examples
    runs = {}
    for where in ("default", "mirrored"):
        with devices.get(where).scope():
            model = functional(ReadmeStep)
            model.compile(optimizer=keras.optimizers.SGD(0.1))
        history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        runs[where] = model, history.history["batch_loss"]
    (one, one_losses), (two, two_losses) = runs["default"], runs["mirrored"]
    assert_weights_equal(two, one)
    np.testing.assert_allclose(two_losses, one_losses, atol=ATOL)
    # The last batch's loss, from the trained weights of the step before.
    assert all(loss > 0.1 for loss in one_losses)


def test_empty_data_under_a_strategy_does_what_one_device_does():
    x, y = np.zeros((0, 4), "float32"), np.zeros((0,), "int32")
    results = {}
    for where in ("default", "mirrored"):
        with devices.get(where).scope():
            model = compile_classifier(functional())
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
        history = model.fit(dataset, epochs=2, verbose=0).history
        results[where] = history, model.evaluate(dataset, verbose=0)
    assert results["mirrored"] == results["default"] == ({}, [])


@pytest.mark.parametrize("kind", ["array", "dataset"])
def test_predict_on_empty_data_gives_no_rows(kind):
    x = np.zeros((0, 4), "float32")
    if kind == "dataset":
        x = tf.data.Dataset.from_tensor_slices(x).batch(8)
    for where in ("default", "mirrored"):
        with devices.get(where).scope():
            model = functional()
        predictions = model.predict(x, verbose=0)
        assert predictions.shape == (0, 2) and predictions.dtype == np.float32
        # Later calls with data still predict.
        assert model.predict(np.ones((3, 4), "float32"), verbose=0).shape == (3, 2)


@pytest.mark.parametrize("kind", ["array", "dataset"])
def test_text_labels_name_y_and_say_how_to_encode_them(kind):
    x, _ = small_data()
    y = np.array(["cat", "dog"])[np.arange(len(x)) % 2]
    data = {"x": x, "y": y}
    if kind == "dataset":
        data = {"x": tf.data.Dataset.from_tensor_slices((x, y)).batch(8)}
    with devices.get("mirrored").scope():
        model = compile_classifier(functional())
    with pytest.raises(
        ValueError,
        match=r"labels `y` are text.*Received: y of dtype (str96|string).*"
        r"StringLookup",
    ):
        model.fit(**data, verbose=0)
    with pytest.raises(ValueError, match="labels `validation_data` are text"):
        model.fit(x, np.zeros(len(x), "int32"), validation_data=(x, y), verbose=0)
    # Nothing was trained: the weights are the initial ones.
    assert_weights_equal(model, functional())


@pytest.mark.parametrize("label", [2, -1])
def test_a_class_label_out_of_range_names_y_the_label_and_the_range(label):
    x, y = small_data(16)
    y[5] = label
    with devices.get("mirrored").scope():
        model = compile_classifier(functional())
    with pytest.raises(
        ValueError,
        match=rf"labels `y` hold class {label}, outside the range \[0, 2\).*"
        "Received: a label",
    ):
        model.fit(x, y, batch_size=8, verbose=0)


class CountBatches(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1


def test_a_python_generator_under_a_strategy_loses_no_batch():
    """The model builds from the data's spec: no batch is read before the
    first step, so a one-shot generator gives every batch to training."""
    x, y = small_data(101)
    runs = {}
    for where in ("default", "mirrored"):
        with devices.get(where).scope():
            model = compile_classifier(functional())
        counter = CountBatches()
        batches = ((x[i : i + 16], y[i : i + 16]) for i in range(0, 101, 16))
        model.fit(batches, epochs=1, verbose=0, callbacks=[counter])
        runs[where] = model, counter.batches
    assert runs["default"][1] == runs["mirrored"][1] == 7
    assert_weights_equal(runs["mirrored"][0], runs["default"][0])


class Batches(keras.utils.PyDataset):
    """101 examples in 7 batches of up to 16."""

    def __init__(self, x, y, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = x, y

    def __len__(self):
        return 7

    def __getitem__(self, index):
        part = slice(index * 16, (index + 1) * 16)
        return self.x[part], self.y[part]


@pytest.mark.parametrize(
    "workers, processes",
    # Worker processes are child processes: the slow tier's (conftest.py).
    [(1, False), (2, False), pytest.param(2, True, marks=pytest.mark.slow)],
)
def test_a_py_dataset_under_a_strategy_equals_one_device(workers, processes):
    x, y = small_data(101)
    runs = {}
    for where in ("default", "mirrored"):
        with devices.get(where).scope():
            model = compile_classifier(functional())
        options = {"workers": workers, "use_multiprocessing": processes}
        data = Batches(x, y, **(options if where == "mirrored" else {}))
        runs[where] = model.fit(data, epochs=2, shuffle=False, verbose=0), model
    assert_weights_equal(runs["mirrored"][1], runs["default"][1])
    np.testing.assert_allclose(
        runs["mirrored"][0].history["loss"],
        runs["default"][0].history["loss"],
        atol=ATOL,
    )


def test_a_dataset_of_unknown_cardinality_under_a_strategy_equals_one_device():
    x, y = small_data(101)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).filter(
        lambda features, label: tf.reduce_sum(features) > 1.5
    )
    assert dataset.cardinality() == tf.data.UNKNOWN_CARDINALITY
    runs = {}
    for where in ("default", "mirrored"):
        with devices.get(where).scope():
            model = compile_classifier(functional())
        history = model.fit(dataset.batch(16), epochs=2, verbose=0).history
        runs[where] = history, model.evaluate(dataset.batch(16), verbose=0), model
    assert_weights_equal(runs["mirrored"][2], runs["default"][2])
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(
            runs["mirrored"][0][key], runs["default"][0][key], atol=ATOL
        )
    np.testing.assert_allclose(runs["mirrored"][1], runs["default"][1], atol=ATOL)


@pytest.mark.slow  # 16 s: five compiled models, for the fast tier's time
def test_a_loss_for_some_outputs_takes_labels_for_those_only():
    """`loss=["mse", None, None]` and one label array, as Keras allows."""
    rng = np.random.default_rng(0)
    x = rng.random((37, 4), dtype=np.float32)
    y = rng.random((37, 2), dtype=np.float32)
    runs = {}
    for where, model_class in (
        ("default", keras.Model),
        ("mirrored", keras_ctl.CTLModel),
    ):
        with devices.get(where).scope():
            inputs = keras.Input((4,))
            outputs = [
                keras.layers.Dense(
                    2, kernel_initializer=keras.initializers.GlorotUniform(i)
                )(inputs)
                for i in range(3)
            ]
            model = model_class(inputs, outputs)
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss=["mse", None, None])
        history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        runs[where] = model, history.history["loss"], model.evaluate(x, y, verbose=0)
    assert_weights_equal(runs["mirrored"][0], runs["default"][0])
    np.testing.assert_allclose(runs["mirrored"][1], runs["default"][1], atol=ATOL)
    assert runs["mirrored"][2] == pytest.approx(runs["default"][2], abs=ATOL)


def test_a_legacy_h5_file_loads_without_custom_objects(tmp_path):
    x, y = small_data()
    model = compile_classifier(functional())
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras calls the format legacy
        model.save(tmp_path / "model.h5")
    loaded = keras.models.load_model(tmp_path / "model.h5")
    assert isinstance(loaded, keras_ctl.CTLModel)
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6
    )


class LazySubclassed(keras_ctl.CTLModel):
    """Built on its first batch, inside `fit()`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(
            2, kernel_initializer=keras.initializers.GlorotUniform(3)
        )

    def call(self, x):
        return self.dense(x)


def test_xla_with_ema_builds_a_lazy_model_on_one_device():
    """`jit_compile=True`, `use_ema=True`, a subclassed model unbuilt before
    `fit()`, an uneven last batch: trains as the same model without XLA."""
    x, y = small_data(10)
    runs = []
    for jit_compile in (True, False):
        model = LazySubclassed()
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, use_ema=True),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit_compile,
        )
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        runs.append(model)
    assert_weights_equal(runs[0], runs[1])
    assert int(runs[0].optimizer.iterations.numpy()) == 4


@pytest.mark.parametrize("outside", ["optimizer", "model"])
def test_an_object_created_outside_the_strategy_scope_is_named(outside):
    strategy = devices.get("mirrored")
    x, y = np.ones((8, 4), "float32"), np.ones((8, 2), "float32")
    optimizer = keras.optimizers.SGD(name="outside") if outside == "optimizer" else None
    model = functional() if outside == "model" else None
    with strategy.scope():
        model = model or functional()
        model.compile(optimizer=optimizer or keras.optimizers.SGD(), loss="mse")
    what = (
        "The optimizer 'outside' was"
        if outside == "optimizer"
        else "The model's weights were"
    )
    refused_untouched(
        model,
        x,
        y,
        rf"{what} created outside `strategy.scope\(\)` of the MirroredStrategy"
        rf".*Create the {outside} inside `with strategy.scope\(\):`",
    )


def refused_untouched(model, x, y, match):
    """`fit` stops with a `ValueError` matching `match`, before any step:
    nothing the user had changed."""
    before = [w.numpy() for w in model.weights]
    with pytest.raises(ValueError, match=match):
        model.fit(x, y, batch_size=4, verbose=0)
    for w, b in zip(model.weights, before, strict=True):
        np.testing.assert_array_equal(w.numpy(), b)


@pytest.mark.parametrize("trained_first", [False, True], ids=["compiled", "trained"])
def test_a_model_made_outside_every_scope_and_fit_inside_one_is_named(trained_first):
    """Built and compiled with no strategy (and maybe trained on one
    device), then fit inside a strategy's scope: TensorFlow's bare "Mixing
    different tf.distribute.Strategy objects" or "Must not nest" before."""
    x, y = np.ones((8, 4), "float32"), np.ones((8, 2), "float32")
    model = functional()
    model.compile(optimizer=keras.optimizers.SGD(), loss="mse")
    if trained_first:
        model.fit(x, y, batch_size=4, verbose=0)
    with devices.get("mirrored").scope():
        refused_untouched(
            model,
            x,
            y,
            r"The model's weights were created outside `strategy.scope\(\)` "
            r"of the MirroredStrategy.*Create the model inside",
        )


class CountedMSE(keras.losses.MeanSquaredError):
    """Counts its calls (each one runs Python: the step runs eagerly)."""

    calls = 0

    def call(self, y_true, y_pred):
        CountedMSE.calls += 1
        return super().call(y_true, y_pred)


@pytest.mark.parametrize(
    "reduction, weighted",
    # One foldable loss, one whose count needs a collective (weight sums).
    [("sum_over_batch_size", False), ("mean_with_sample_weight", True)],
)
def test_each_loss_is_computed_once_a_step(reduction, weighted):
    x = np.random.default_rng(0).random((24, 4)).astype("float32")
    y = np.ones((24, 2), "float32")
    with devices.get("mirrored").scope():
        model = functional()
        model.compile(
            optimizer="sgd", loss=CountedMSE(reduction=reduction), run_eagerly=True
        )
    CountedMSE.calls = 0
    weights = np.linspace(0.5, 1.5, 24) if weighted else None
    model.fit(x, y, sample_weight=weights, batch_size=8, shuffle=False, verbose=0)
    # Keras's build before the first step, the readings of steps 1 and 2 (a
    # loss of one's own, in 2 parts of 4 examples: on a part, on it in
    # reverse order for the round-off, and on its halves), then 3 steps on
    # 2 replicas (a loss computed twice when its count needed a collective
    # made 13 steps' calls).
    assert CountedMSE.calls == 1 + 2 * 2 * 4 + 6


def test_fit_inside_another_strategy_scope_is_named():
    with devices.get("mirrored").scope():
        model = functional()
        model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 4), "float32"), np.ones((8, 2), "float32")
    with devices.get("onedevice").scope():
        with pytest.raises(
            ValueError,
            match="inside the scope of a OneDeviceStrategy, but was created "
            "under a MirroredStrategy",
        ):
            model.fit(x, y, batch_size=4, verbose=0)


@pytest.mark.parametrize("method", ["fit", "evaluate", "predict"])
def test_a_dataset_of_single_examples_is_named(method):
    with devices.get("mirrored").scope():
        model = functional()
        model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 4), "float32"), np.ones((8, 2), "float32")
    single = tf.data.Dataset.from_tensor_slices((x, y) if method != "predict" else x)
    with pytest.raises(
        ValueError, match=r"a dataset of single examples .*\(4,\).*dataset.batch"
    ):
        getattr(model, method)(single, verbose=0)
    # Batched, it runs.
    getattr(model, method)(single.batch(4), verbose=0)
