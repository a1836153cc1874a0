"""The parity kit passes an exact model and fails, with a table, on a step
that divides by its local batch."""

import cases
import children
import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_ctl
from keras_ctl.testing import assert_replica_invariant


def data():
    rng = np.random.default_rng(0)
    x = rng.random((101, 8), dtype=np.float32)  # batches of 16: the last 3 + 2
    y = (x[:, :3].argmax(axis=1)).astype("int32")
    return x, y


def layers():
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    return inputs, keras.layers.Dense(3)(hidden)


def build_exact():
    model = keras_ctl.CTLModel(*layers())
    model.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class LocalMean(keras_ctl.CTLModel):
    """The tutorial's mistake, in replica shares: each replica's mean over
    its own examples, over the replica count."""

    @keras_ctl.written_in_shares
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            per_example = keras.losses.sparse_categorical_crossentropy(
                y, self(x, training=True), from_logits=True
            )
            loss = tf.reduce_mean(per_example) / keras_ctl.num_replicas()
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        return {"step_loss": keras_ctl.ReplicaSum(loss)}


def build_local_mean():
    model = LocalMean(*layers())
    model.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def test_an_exact_model_passes_with_its_report():
    x, y = data()
    report = assert_replica_invariant(
        build_exact, x, y, batch_size=16, replicas=(2, 3), epochs=2
    )
    assert set(report) == {2, 3}
    for differences in report.values():
        assert set(differences) == {
            "weights",
            "history/loss",
            "history/accuracy",
            "evaluate/loss",
            "evaluate/accuracy",
        }
        assert max(differences.values()) <= 1e-5


def test_a_local_mean_fails_with_a_table():
    x, y = data()
    with pytest.raises(AssertionError) as failure:
        assert_replica_invariant(build_local_mean, x, y, batch_size=16, replicas=(2,))
    message = str(failure.value)
    assert "| replicas | value | one device | R replicas | difference |" in message
    row = next(
        line for line in message.splitlines() if line.startswith("| 2 | weights")
    )
    assert float(row.rstrip(" |").rsplit("|", 1)[1]) > 1e-5
    # What is known to differ, and what to do.
    assert (
        "- LocalMean.train_step: a step of your own declared `written_in_shares`"
        in message
    )
    assert "keras_ctl.global_mean" in message


class InBatchNegatives(keras_ctl.CTLModel):
    """Retrieval's loss: each query's positive against the batch's others."""

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        scores = keras.ops.matmul(y_pred, keras.ops.transpose(y_pred))
        labels = keras.ops.eye(keras.ops.shape(scores)[0])
        return keras.ops.mean(
            keras.losses.categorical_crossentropy(labels, scores, from_logits=True)
        )


def build_in_batch_negatives(compute_loss_over="replica_batch"):
    model = InBatchNegatives(*layers())
    model.compile(
        optimizer=keras.optimizers.SGD(0.5), compute_loss_over=compute_loss_over
    )
    return model


def build_in_batch_negatives_over_the_global_batch():
    return build_in_batch_negatives("global_batch")


def test_a_loss_coupling_the_batch_is_measured_and_its_remedy_passes():
    x, y = data()
    with pytest.raises(AssertionError) as failure:
        assert_replica_invariant(
            build_in_batch_negatives, x, y, batch_size=16, replicas=(2,)
        )
    message = str(failure.value)
    assert (
        "- InBatchNegatives.compute_loss: a `compute_loss` of your own: "
        "measured on a batch of 16, it is " in message
    )
    assert "couples the batch's examples" in message
    report = assert_replica_invariant(
        build_in_batch_negatives_over_the_global_batch,
        x,
        y,
        batch_size=16,
        replicas=(2,),
    )
    assert max(report[2].values()) <= 1e-5


def test_a_nested_build_function_is_refused():
    def build():
        return build_exact()

    with pytest.raises(ValueError, match="module-level function"):
        assert_replica_invariant(build, *data(), batch_size=16)


SCRIPT = """
import keras
import numpy as np
import keras_ctl
from keras_ctl.testing import assert_replica_invariant


def build():
    inputs = keras.Input((4,))
    model = keras_ctl.CTLModel(inputs, keras.layers.Dense(2)(inputs))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer="sgd", loss=loss)
    return model


if __name__ == "__main__":
    x = np.random.default_rng(0).random((37, 4), dtype="float32")
    y = (x[:, 0] > 0.5).astype("int32")
    report = assert_replica_invariant(build, x, y, batch_size=8, replicas=(2,))
    print("largest difference", max(report[2].values()))
"""


def test_the_kit_runs_from_a_script(tmp_path):
    script = tmp_path / "check_parity.py"
    script.write_text(SCRIPT)
    result = children.run([children.PYTHON, script], timeout=300, cwd=tmp_path)
    assert result.returncode == 0, children.output(result)
    largest = float(result.stdout.strip().rsplit(" ", 1)[1])
    assert largest <= 1e-5


def build_guide_step_cnn():
    """The keras.io guide's `train_step` on a convolution."""
    inputs = keras.Input((8, 8, 1))
    outputs = cases._dense(10, 2)(cases._conv_body(inputs))
    model = cases.keras_io_guide_model(keras_ctl.CTLModel, "train_step")(
        inputs, outputs
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def test_a_step_of_ones_own_with_an_empty_replica():
    """97 examples, batch 8: a replica gets none in the last step, and its
    convolution runs on an empty batch, with TensorFlow's oneDNN CPU kernels
    on (their default): the step is exact."""
    x, y = cases.digits(97)
    report = assert_replica_invariant(
        build_guide_step_cnn, x, y, batch_size=8, replicas=(2, 3), epochs=2
    )
    assert max(max(differences.values()) for differences in report.values()) <= 1e-5
