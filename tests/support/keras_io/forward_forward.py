"""vision/forwardforward.py: `FFNetwork(dims)`, whose `train_step` (a
`tf.function` of its own) overlays each image's label on it (the
positives) and a shuffled label (the negatives), then has each `FFDense`
layer train itself: `forward_forward` takes `num_epochs` local steps, each
the gradient of the mean of a softplus of the layer's goodness over the
positives and negatives, applied by the layer's own `Adam` (never the
model's optimizer). The layer's `Mean` metric of these losses is read
inside the step and added to the model's `loss_var`; the step logs
`loss_var / loss_count`.

Changed: sizes (28x28 images as published, generated: the first 10 pixels
0, as MNIST's; dims `[784, 8, 8]` in place of `[784, 500, 500]`; 3 local
steps a batch in place of 50); the overlay's, the loss's and the
trackers' dtypes are the run's (the example makes them float64, float32
and float32); the negatives' labels go through `self.negative_labels(y,
data)`, which in parity mode takes them from the data (a shuffle of the
labels drawn once, before `fit()`); the example's `predict` and plots are
left out, `fit()` never calls them, and so are the step's `print`s. Its
`train_step` returns a loss whose mean runs across every step of the run
(`loss_var` is never reset), as published.

Under R replicas the step is read as one device's code, and every
`apply` of a layer's own optimizer is summed across replicas as the
model's is (each replica's gradient of its part's mean weighed by the
part): the layers' weights equal one device's (parity mode, 2 replicas,
float64: 2.2e-16). Each layer's optimizer builds its variables in the
eager first step (built as the step was traced, it was left marked built
without its moments). What differs is the tracker's result read inside
the step: each replica's `Mean` holds its own examples' losses, so
`loss_var`, and the `FinalLoss` logged from it, are the replica's own
(8.1e-3 and 2.7e-3 off one device on 2 replicas), a batch statistic kept
in the model's variables: keras_ctl warns of it by default, naming
`loss_var` and the metric (`WARNED`), and refuses it with
`batch_statistics="global"`. As written, `tf.random.shuffle` draws each
replica's own negatives, warned of too.

On 3 replicas in parity mode the first batch's measurement stops, named
("raised as Trained's step was measured on the first batch ... in
slices"): its parts (the replicas hold 3, 3 and 2 examples, measured one
a replica a part) leave the third replica without examples in the last
part, the eager first step runs the example's `tf.map_fn` on none, which
then returns a tensor of rank 1, and the layer's norm over axis 1 fails.
The step itself never meets an empty replica eagerly there.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import ops
from tensorflow.compiler.tf2xla.python import xla

import keras_io

SOURCE = "examples/vision/forwardforward.py"

DIMS = [784, 8, 8]  # changed: [784, 500, 500]
NUM_EPOCHS = 3  # changed: 50 local steps a batch


class FFDense(keras.layers.Layer):
    """
    A custom ForwardForward-enabled Dense layer. It has an implementation of the
    Forward-Forward network internally for use.
    This layer must be used in conjunction with the `FFNetwork` model.
    """

    def __init__(
        self,
        units,
        init_optimizer,
        loss_metric,
        num_epochs=50,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(
            units=units,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer,
            bias_regularizer=bias_regularizer,
        )
        self.relu = keras.layers.ReLU()
        self.optimizer = init_optimizer()
        self.loss_metric = loss_metric
        self.threshold = 1.5
        self.num_epochs = num_epochs

    def call(self, x):
        x_norm = ops.norm(x, ord=2, axis=1, keepdims=True)
        x_norm = x_norm + 1e-4
        x_dir = x / x_norm
        res = self.dense(x_dir)
        return self.relu(res)

    def forward_forward(self, x_pos, x_neg):
        for i in range(self.num_epochs):  # noqa: B007 (as written)
            with tf.GradientTape() as tape:
                g_pos = ops.mean(ops.power(self.call(x_pos), 2), 1)
                g_neg = ops.mean(ops.power(self.call(x_neg), 2), 1)

                loss = ops.log(
                    1
                    + ops.exp(
                        ops.concatenate(
                            [-g_pos + self.threshold, g_neg - self.threshold], 0
                        )
                    )
                )
                # changed: the run's dtype (the example casts to float32)
                mean_loss = ops.cast(ops.mean(loss), dtype=keras.config.floatx())
                self.loss_metric.update_state([mean_loss])
            gradients = tape.gradient(mean_loss, self.dense.trainable_weights)
            self.optimizer.apply_gradients(zip(gradients, self.dense.trainable_weights))
        return (
            ops.stop_gradient(self.call(x_pos)),
            ops.stop_gradient(self.call(x_neg)),
            self.loss_metric.result(),
        )


def model_class(base):
    class FFNetwork(base):
        """
        A `keras.Model` that supports a `FFDense` network creation. This model
        can work for any kind of classification task. It has an internal
        implementation with some details specific to the MNIST dataset which can be
        changed as per the use-case.
        """

        def __init__(
            self,
            dims,
            init_layer_optimizer=lambda: keras.optimizers.Adam(learning_rate=0.03),
            **kwargs,
        ):
            super().__init__(**kwargs)
            floatx = keras.config.floatx()  # changed: the run's dtype (float32)
            self.init_layer_optimizer = init_layer_optimizer
            self.loss_var = keras.Variable(0.0, trainable=False, dtype=floatx)
            self.loss_count = keras.Variable(0.0, trainable=False, dtype=floatx)
            self.layer_list = [keras.Input(shape=(dims[0],))]
            self.metrics_built = False
            for d in range(len(dims) - 1):
                self.layer_list += [
                    FFDense(
                        dims[d + 1],
                        init_optimizer=self.init_layer_optimizer,
                        loss_metric=keras.metrics.Mean(),
                        num_epochs=NUM_EPOCHS,  # changed: 50
                    )
                ]

        @tf.function(reduce_retracing=True)
        def overlay_y_on_x(self, data):
            X_sample, y_sample = data
            dtype = X_sample.dtype  # changed: the run's dtype (float64)
            max_sample = ops.amax(X_sample, axis=0, keepdims=True)
            max_sample = ops.cast(max_sample, dtype=dtype)
            X_zeros = ops.zeros([10], dtype=dtype)
            X_update = xla.dynamic_update_slice(X_zeros, max_sample, [y_sample])
            X_sample = xla.dynamic_update_slice(X_sample, X_update, [0])
            return X_sample, y_sample

        @tf.function(jit_compile=False)
        def train_step(self, data):
            x, y = self.images_and_labels(data)  # changed: `x, y = data`

            if not self.metrics_built:
                # build metrics to ensure they can be queried without erroring out.
                # We can't update the metrics' state, as we would usually do, since
                # we do not perform predictions within the train step
                for metric in self.metrics:
                    if hasattr(metric, "build"):
                        metric.build(y, y)
                self.metrics_built = True

            # Flatten op
            x = ops.reshape(x, [-1, ops.shape(x)[1] * ops.shape(x)[2]])

            x_pos, y = ops.vectorized_map(self.overlay_y_on_x, (x, y))

            random_y = self.negative_labels(y, data)  # changed: tf.random.shuffle(y)
            x_neg, y = tf.map_fn(self.overlay_y_on_x, (x, random_y))

            h_pos, h_neg = x_pos, x_neg

            for idx, layer in enumerate(self.layers):  # noqa: B007 (as written)
                if isinstance(layer, FFDense):
                    h_pos, h_neg, loss = layer.forward_forward(h_pos, h_neg)
                    self.loss_var.assign_add(loss)
                    self.loss_count.assign_add(1.0)
                else:
                    x = layer(x)
            mean_res = ops.divide(self.loss_var, self.loss_count)
            return {"FinalLoss": mean_res}

    return FFNetwork


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)

    class Trained(model_class(base)):
        def images_and_labels(self, data):
            return data[:2]

        def negative_labels(self, y, data):
            if parity:
                return data[2]
            return tf.random.shuffle(y)

    floatx = keras.config.floatx()
    rng = np.random.default_rng(3)
    images = rng.random((keras_io.SIZE, 28, 28)).astype(floatx)
    images[:, 0, :10] = 0  # MNIST's first 10 pixels, where the label goes
    labels = rng.integers(0, 10, keras_io.SIZE)
    data = (images, labels)
    if parity:
        data += (rng.permutation(labels),)
    with strategy.scope():
        model = Trained(dims=DIMS)
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate=0.03),
            loss="mse",
            jit_compile=False,
            metrics=[],
        )
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(keras_io.BATCH)
    history = model.fit(dataset, epochs=keras_io.EPOCHS, verbose=0)
    found = keras_io.result(model, history)
    found["layer_weights"] = [
        np.asarray(w, "float64")
        for layer in model.layer_list[1:]
        for w in layer.trainable_weights
    ]
    # The layers' own optimizers, which the step applies.
    found["iterations"] += sorted(
        int(layer.optimizer.iterations.numpy()) for layer in model.layer_list[1:]
    )
    return found
