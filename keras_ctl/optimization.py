"""Computing and applying the gradients of a replica's loss share."""

import warnings


def minimize(loss, variables, optimizer, tape):
    """Applies the gradients of `loss` with respect to `variables`.

    `loss` is this replica's share of the global loss (see
    `keras_ctl.global_mean`): the optimizer sums gradients across replicas,
    so the update equals one device's update on the global batch. The loss is
    scaled through `optimizer.scale_loss()` on the same tape, so a
    `keras.optimizers.LossScaleOptimizer` (mixed precision) keeps its own loss
    scale; it unscales the gradients when it applies them.

    Args:
        loss: Scalar loss share recorded on `tape`.
        variables: The variables to update (e.g. `model.trainable_weights`).
        optimizer: A `keras.optimizers.Optimizer`, built for `variables`.
        tape: The `tf.GradientTape` that recorded the forward pass. It is
            re-entered to record the loss scaling, then consumed.

    Returns:
        The list of gradients that were applied (loss-scaled when the
        optimizer scales the loss).

    Example:

    ```python
    with tf.GradientTape() as tape:
        y_pred = self(x, training=True)
        loss = keras_ctl.global_mean(per_example_loss(y, y_pred))
    keras_ctl.minimize(loss, self.trainable_weights, self.optimizer, tape)
    ```
    """
    variables = list(variables)
    if not variables:
        warnings.warn("The model does not have any trainable weights.", stacklevel=2)
        return []
    with tape:
        scaled_loss = optimizer.scale_loss(loss)
    gradients = tape.gradient(scaled_loss, variables)
    optimizer.apply_gradients(zip(gradients, variables))
    return gradients


def build_optimizer(optimizer, variables, strategy):
    """Creates the optimizer's slot variables now, in `strategy`'s scope.

    Keras optimizers create their variables on first use, which fails inside
    a distributed `tf.function`; building them up front avoids it.
    """
    if optimizer is not None and not optimizer.built and variables:
        with strategy.scope():
            optimizer.build(variables)
