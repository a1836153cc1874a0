"""vision/nl_image_search.py: `DualEncoder(text_encoder, image_encoder,
temperature)`, a CLIP dual encoder whose `__init__` picks its train step by
backend (`self.train_step = self.train_step_tf`, an attribute of the
instance), whose `compute_loss(caption_embeddings, image_embeddings)`
takes cross-entropies between caption-image similarities and targets made
from the batch's caption-caption and image-image similarities (every
example's loss depends on the whole batch), and whose `test_step` (run on
validation data here) logs the same loss. The loss it returns is a value
per example (the comment says a mean), so `tape.gradient` sums it.

Changed: sizes (8x8 images, 5-token captions of a 12-word vocabulary,
8-wide projections); a small frozen convolution with average pooling for
the pretrained EfficientNetV2B3, and for keras-hub's pretrained BERT a
small frozen embedding of the preprocessor's `token_ids` and
`padding_mask` whose `pooled_output` is a dense `tanh` of the unmasked
tokens' embeddings summed (never singular, also at the zero placeholder
example a replica without examples computes on); the torch step
(`train_step_torch`, chosen on the torch backend only) is left out;
`call()` uses the model's encoders (the published one reads the module's
globals `text_encoder` and `vision_encoder`, the same objects).

Its train step is an attribute of the instance, so keras_ctl, which
looks at the class's `train_step` (Keras's), runs it as written in
replica shares, never read as one device's code. As written, each
replica's loss contrasts its own examples only, so under
R replicas it is not one device's. Parity mode sets the projection heads'
Dropout rate to 0.0 and makes the changes of the docs' global-batch guide
in both steps: the embeddings go through `keras_ctl.all_gather`, and the
train step's gradient is taken of `1 / R` of the global batch's loss.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers
from keras import ops

import keras_ctl
import keras_io

SOURCE = "examples/vision/nl_image_search.py"

IMAGE_SHAPE, VOCABULARY, TOKENS, WIDTH = (8, 8, 3), 12, 5, 8


def project_embeddings(
    embeddings, num_projection_layers, projection_dims, dropout_rate
):
    projected_embeddings = layers.Dense(units=projection_dims)(embeddings)
    for _ in range(num_projection_layers):
        x = ops.gelu(projected_embeddings)
        x = layers.Dense(projection_dims)(x)
        x = layers.Dropout(dropout_rate)(x)
        x = layers.Add()([projected_embeddings, x])
        projected_embeddings = layers.LayerNormalization()(x)
    return projected_embeddings


def create_vision_encoder(
    num_projection_layers, projection_dims, dropout_rate, trainable=False
):
    # changed: a small convolution for the pretrained EfficientNetV2B3
    efficientNet = keras.Sequential(
        [
            layers.Input(shape=IMAGE_SHAPE),
            layers.Conv2D(4, 3, strides=2, activation="relu"),
            layers.GlobalAveragePooling2D(),
        ],
        name="efficientnet",
    )
    # Set the trainability of the base encoder.
    for layer in efficientNet.layers:
        layer.trainable = trainable
    # Receive the images as inputs.
    inputs = layers.Input(shape=IMAGE_SHAPE, name="image_input")
    # Generate the embeddings for the images using the xception model.
    embeddings = efficientNet(inputs)
    embeddings = keras.layers.Dense(16, activation="gelu")(embeddings)  # changed
    # Project the embeddings produced by the model.
    outputs = project_embeddings(
        embeddings, num_projection_layers, projection_dims, dropout_rate
    )
    # Create the vision encoder model.
    return keras.Model(inputs, outputs, name="vision_encoder")


def small_bert(name):
    """A stand-in for keras-hub's `BertBackbone`: the preprocessor's inputs
    and a `pooled_output`, a dense `tanh` of the unmasked tokens' embeddings
    summed (never singular: a caption of no token gives the bias)."""
    token_ids = layers.Input(shape=(TOKENS,), dtype="int32", name="token_ids")
    padding_mask = layers.Input(shape=(TOKENS,), dtype="bool", name="padding_mask")
    embedded = layers.Embedding(VOCABULARY, 8)(token_ids)
    kept = ops.expand_dims(ops.cast(padding_mask, embedded.dtype), -1)
    summed = ops.sum(embedded * kept, axis=1)
    pooled = layers.Dense(8, activation="tanh")(summed)
    return keras.Model(
        {"token_ids": token_ids, "padding_mask": padding_mask},
        {"pooled_output": pooled},
        name=name,
    )


def create_text_encoder(
    num_projection_layers, projection_dims, dropout_rate, trainable=False
):
    # changed: a small embedding for the pretrained BERT
    bert = small_bert(name="BERT")
    # Set the trainability of the base encoder.
    bert.trainable = trainable
    # Receive the text as inputs.
    inputs = bert.input
    # Preprocess the text.
    # Generate embeddings for the preprocessed text using the BERT model.
    embeddings = bert(inputs)["pooled_output"]
    # Project the embeddings produced by the model.
    outputs = project_embeddings(
        embeddings, num_projection_layers, projection_dims, dropout_rate
    )
    # Create the text encoder model.
    return keras.Model(inputs, outputs, name="text_encoder")


def gathered(embeddings, parity):
    """Parity mode: every replica's embeddings, in one device's order."""
    return keras_ctl.all_gather(embeddings) if parity else embeddings


def model_class(base, parity):
    class DualEncoder(base):
        def __init__(self, text_encoder, image_encoder, temperature=1.0, **kwargs):
            super().__init__(**kwargs)
            self.text_encoder = text_encoder
            self.image_encoder = image_encoder
            self.temperature = temperature
            self.loss_tracker = keras.metrics.Mean(name="loss")
            ## Select train_step function based on the keras backend
            # changed: the torch step left out
            if keras.config.backend() == "tensorflow":
                self.train_step = self.train_step_tf

        @property
        def metrics(self):
            return [self.loss_tracker]

        def call(self, features, training=False):
            # Place each encoder on a separate GPU (if available).
            # TF will fallback on available devices if there are fewer than 2 GPUs.
            # Get the embeddings for the captions.
            # changed: the model's encoders (the published call reads the
            # globals, the same objects)
            caption_embeddings = self.text_encoder(
                features["caption"], training=training
            )
            # Get the embeddings for the images.
            image_embeddings = self.image_encoder(features["image"], training=training)
            return caption_embeddings, image_embeddings

        def compute_loss(self, caption_embeddings, image_embeddings):
            # similarity between all image and caption embeddings
            logits = ops.divide(
                ops.einsum("ae,be -> ab", caption_embeddings, image_embeddings),
                self.temperature,
            )

            # similarity between all image and image embeddings
            images_similarity = ops.einsum(
                "ae,be -> ab", image_embeddings, image_embeddings
            )

            # similarity between all caption and caption embeddings
            captions_similarity = ops.einsum(
                "ae,be -> ab", caption_embeddings, caption_embeddings
            )

            targets = keras.activations.softmax(
                (captions_similarity + images_similarity) / (2 * self.temperature)
            )

            # Compute the loss for the captions using cross-entropy
            captions_loss = keras.losses.categorical_crossentropy(
                y_true=targets, y_pred=logits, from_logits=True
            )
            # Compute the loss for the images using crossentropy
            images_loss = keras.losses.categorical_crossentropy(
                y_true=ops.transpose(targets),
                y_pred=ops.transpose(logits),
                from_logits=True,
            )
            # Return the mean of the loss over the batch.
            return (captions_loss + images_loss) / 2

        @keras_ctl.written_in_shares
        def train_step_tf(self, features):
            with tf.GradientTape() as tape:
                # Forward pass
                caption_embeddings, image_embeddings = self(features, training=True)
                # changed in parity mode: the global batch's embeddings
                caption_embeddings = gathered(caption_embeddings, parity)
                image_embeddings = gathered(image_embeddings, parity)
                loss = self.compute_loss(caption_embeddings, image_embeddings)
                # changed in parity mode: the replica's 1/R of the loss
                share = loss / (keras_ctl.num_replicas() if parity else 1)
            # Backward pass
            gradients = tape.gradient(share, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
            # Monitor loss
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

        def test_step(self, features):
            caption_embeddings, image_embeddings = self(features, training=False)
            # changed in parity mode: the global batch's embeddings
            caption_embeddings = gathered(caption_embeddings, parity)
            image_embeddings = gathered(image_embeddings, parity)
            loss = self.compute_loss(caption_embeddings, image_embeddings)
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

        if parity:  # changed: the gathered rows' loss is each replica's whole
            test_step = keras_ctl.written_in_shares(test_step)

    return DualEncoder


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    dropout_rate = 0.0 if parity else 0.1  # changed in parity mode: no Dropout
    with strategy.scope():
        vision_encoder = create_vision_encoder(
            num_projection_layers=1,
            projection_dims=WIDTH,
            dropout_rate=dropout_rate,
            trainable=False,
        )
        text_encoder = create_text_encoder(
            num_projection_layers=1,
            projection_dims=WIDTH,
            dropout_rate=dropout_rate,
            trainable=False,
        )
        dual_encoder = model_class(base, parity)(
            text_encoder, vision_encoder, temperature=0.05, name="DualEncoder"
        )
        dual_encoder.compile(
            optimizer=keras.optimizers.AdamW(learning_rate=0.001, weight_decay=0.001),
            run_eagerly=False,
        )
    rng = np.random.default_rng(10)
    lengths = rng.integers(2, TOKENS + 1, keras_io.SIZE)
    padding_mask = np.arange(TOKENS) < lengths[:, None]
    token_ids = np.where(
        padding_mask, rng.integers(1, VOCABULARY, (keras_io.SIZE, TOKENS)), 0
    )
    images = rng.random((keras_io.SIZE, *IMAGE_SHAPE)).astype(keras.config.floatx())
    features = {
        "caption": {
            "token_ids": token_ids.astype("int32"),
            "padding_mask": padding_mask,
        },
        "image": images,
    }
    train_dataset = tf.data.Dataset.from_tensor_slices(features).batch(keras_io.BATCH)
    valid_dataset = tf.data.Dataset.from_tensor_slices(
        keras.tree.map_structure(lambda values: values[:9], features)
    ).batch(keras_io.BATCH)
    history = dual_encoder.fit(
        train_dataset,
        epochs=keras_io.EPOCHS,
        validation_data=valid_dataset,
        verbose=0,
    )
    return keras_io.result(dual_encoder, history)
