"""The hand-written loop of the TensorFlow tutorial "Custom training with
tf.distribute.Strategy"."""

import keras
import tensorflow as tf


def train(model, x, y, global_batch_size, epochs, strategy, learning_rate=0.1):
    """Trains `model` with `strategy.run(train_step)` as the tutorial does.

    Returns the tutorial's per-epoch loss: the mean of the step losses.
    """
    with strategy.scope():
        loss_object = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=None
        )
        optimizer = keras.optimizers.SGD(learning_rate)
        optimizer.build(model.trainable_variables)

    def compute_loss(labels, predictions, model_losses):
        per_example_loss = loss_object(labels, predictions)
        loss = tf.nn.compute_average_loss(
            per_example_loss, global_batch_size=global_batch_size
        )
        if model_losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
        return loss

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = compute_loss(labels, predictions, model.losses)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None
        )

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)
    dist_dataset = strategy.experimental_distribute_dataset(dataset)
    epoch_losses = []
    for _ in range(epochs):
        total_loss, num_batches = 0.0, 0
        for batch in dist_dataset:
            total_loss += float(distributed_train_step(batch))
            num_batches += 1
        epoch_losses.append(total_loss / num_batches)
    return epoch_losses
