"""vision/image_captioning.py: `ImageCaptioningModel(cnn_model, encoder,
decoder, num_captions_per_image, image_aug)`, whose `train_step` augments
the images (random flip, rotation and contrast), embeds them with a frozen
CNN and then, for each of an image's captions, differentiates that
caption's loss under a tape of its own and applies it: several optimizer
updates a step. A caption's loss is the masked mean `reduce_sum(loss *
mask) / reduce_sum(mask)` of a `reduction=None` loss over the batch's
non-padding tokens, and its accuracy the same ratio of correct tokens
(float32); `test_step` logs both through two `Mean` trackers.

The example's Keras 3 version (`import keras`, the compiled loss's
`reduction=None` for Keras 2's `"none"`; its model code is the Keras 2
version's of 2021/10/31). Changed: sizes (8x8 images, 6-token captions of
a 20-token vocabulary, 8-wide embeddings, 16 feed-forward units, 2
captions an image, published 5); the frozen ImageNet EfficientNetB0 is a
tiny frozen untrained CNN (a rescaling and one strided convolution, its
16 positions of 12 channels reshaped as the published 100 positions of
1280); `PositionalEmbedding.embed_scale` is in the run's dtype (the
example makes it float32, which does not multiply float64 embeddings);
no `EarlyStopping` callback; the text pipeline (`TextVectorization` of
Flickr8k captions) is synthetic token ids.

Both ratios divide by the replica's own count of tokens: under R replicas
each replica's caption loss is read as a mean over its examples and
weighed by its share of the examples, not of the tokens, so as written
with captions of different lengths the step is not one device's. Parity
mode takes the augmentation from the data (the images flipped and
contrast-scaled in numpy, `image_aug=None`), sets the decoder's Dropout
rates to 0.0, and makes both ratios the global batch's: the loss with a
Keras `Loss` of `reduction="mean_with_sample_weight"` and the mask as
sample weights (Keras's own masked mean, which keras_ctl divides by the
global batch's count), the accuracy with the correct and counted tokens
summed across replicas (`keras_ctl.all_reduce_sum`). So in parity mode
the steps are declared `keras_ctl.written_in_shares` (the global loss's
gradient is this replica's share; every replica logs the global values);
as written they are read as one device's code.

`PositionalEmbedding` looks its position embedding up once for the whole
batch (`self.position_embeddings(positions)`); keras_ctl sums that table's
sparse gradient position by position, as one device has it, so under
Keras's sparse Adam parity mode equals one device (float64, 2 replicas:
1.1e-15). As published (the replica's own token counts) it differs.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_ctl
import keras_io

SOURCE = "examples/vision/image_captioning.py"

# Desired image dimensions
IMAGE_SIZE = (8, 8)  # changed: (299, 299)

# Vocabulary size
VOCAB_SIZE = 20  # changed: 10000

# Fixed length allowed for any sequence
SEQ_LENGTH = 6  # changed: 25

# Dimension for the image embeddings and token embeddings
EMBED_DIM = 8  # changed: 512

# Per-layer units in the feed-forward network
FF_DIM = 16  # changed: 512

CAPTIONS = 2  # changed: an image's captions, 5
START, END = 1, 2  # the "<start>" and "<end>" tokens


def get_cnn_model():
    # changed: a tiny untrained CNN for the ImageNet EfficientNetB0
    images = layers.Input((*IMAGE_SIZE, 3))
    features = layers.Conv2D(12, 3, strides=2, padding="same", activation="relu")(
        layers.Rescaling(1 / 255.0)(images)
    )
    base_model = keras.Model(images, features)
    # We freeze our feature extractor
    base_model.trainable = False
    base_model_out = base_model.output
    base_model_out = layers.Reshape((-1, base_model_out.shape[-1]))(base_model_out)
    cnn_model = keras.models.Model(base_model.input, base_model_out)
    return cnn_model


class TransformerEncoderBlock(layers.Layer):
    def __init__(self, embed_dim, dense_dim, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim = embed_dim
        self.dense_dim = dense_dim
        self.num_heads = num_heads
        self.attention_1 = layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=embed_dim, dropout=0.0
        )
        self.layernorm_1 = layers.LayerNormalization()
        self.layernorm_2 = layers.LayerNormalization()
        self.dense_1 = layers.Dense(embed_dim, activation="relu")

    def call(self, inputs, training, mask=None):
        inputs = self.layernorm_1(inputs)
        inputs = self.dense_1(inputs)

        attention_output_1 = self.attention_1(
            query=inputs,
            value=inputs,
            key=inputs,
            attention_mask=None,
            training=training,
        )
        out_1 = self.layernorm_2(inputs + attention_output_1)
        return out_1


class PositionalEmbedding(layers.Layer):
    def __init__(self, sequence_length, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_embeddings = layers.Embedding(
            input_dim=vocab_size, output_dim=embed_dim
        )
        self.position_embeddings = layers.Embedding(
            input_dim=sequence_length, output_dim=embed_dim
        )
        self.sequence_length = sequence_length
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim
        self.embed_scale = tf.math.sqrt(
            tf.cast(embed_dim, keras.config.floatx())  # changed: float32
        )

    def call(self, inputs):
        length = tf.shape(inputs)[-1]
        positions = tf.range(start=0, limit=length, delta=1)
        embedded_tokens = self.token_embeddings(inputs)
        embedded_tokens = embedded_tokens * self.embed_scale
        embedded_positions = self.position_embeddings(positions)
        return embedded_tokens + embedded_positions

    def compute_mask(self, inputs, mask=None):
        return tf.math.not_equal(inputs, 0)


class TransformerDecoderBlock(layers.Layer):
    def __init__(
        self, embed_dim, ff_dim, num_heads, rates=(0.1, 0.3, 0.5), **kwargs
    ):  # changed: the dropout rates a parameter (0.0 in parity mode)
        super().__init__(**kwargs)
        self.embed_dim = embed_dim
        self.ff_dim = ff_dim
        self.num_heads = num_heads
        self.attention_1 = layers.MultiHeadAttention(
            num_heads=num_heads,
            key_dim=embed_dim,
            dropout=rates[0],  # changed
        )
        self.attention_2 = layers.MultiHeadAttention(
            num_heads=num_heads,
            key_dim=embed_dim,
            dropout=rates[0],  # changed
        )
        self.ffn_layer_1 = layers.Dense(ff_dim, activation="relu")
        self.ffn_layer_2 = layers.Dense(embed_dim)

        self.layernorm_1 = layers.LayerNormalization()
        self.layernorm_2 = layers.LayerNormalization()
        self.layernorm_3 = layers.LayerNormalization()

        self.embedding = PositionalEmbedding(
            embed_dim=EMBED_DIM, sequence_length=SEQ_LENGTH, vocab_size=VOCAB_SIZE
        )
        self.out = layers.Dense(VOCAB_SIZE, activation="softmax")

        self.dropout_1 = layers.Dropout(rates[1])  # changed: 0.3
        self.dropout_2 = layers.Dropout(rates[2])  # changed: 0.5
        self.supports_masking = True

    def call(self, inputs, encoder_outputs, training, mask=None):
        inputs = self.embedding(inputs)
        causal_mask = self.get_causal_attention_mask(inputs)

        if mask is not None:
            padding_mask = tf.cast(mask[:, :, tf.newaxis], dtype=tf.int32)
            combined_mask = tf.cast(mask[:, tf.newaxis, :], dtype=tf.int32)
            combined_mask = tf.minimum(combined_mask, causal_mask)

        attention_output_1 = self.attention_1(
            query=inputs,
            value=inputs,
            key=inputs,
            attention_mask=combined_mask,
            training=training,
        )
        out_1 = self.layernorm_1(inputs + attention_output_1)

        attention_output_2 = self.attention_2(
            query=out_1,
            value=encoder_outputs,
            key=encoder_outputs,
            attention_mask=padding_mask,
            training=training,
        )
        out_2 = self.layernorm_2(out_1 + attention_output_2)

        ffn_out = self.ffn_layer_1(out_2)
        ffn_out = self.dropout_1(ffn_out, training=training)
        ffn_out = self.ffn_layer_2(ffn_out)

        ffn_out = self.layernorm_3(ffn_out + out_2, training=training)
        ffn_out = self.dropout_2(ffn_out, training=training)
        preds = self.out(ffn_out)
        return preds

    def get_causal_attention_mask(self, inputs):
        input_shape = tf.shape(inputs)
        batch_size, sequence_length = input_shape[0], input_shape[1]
        i = tf.range(sequence_length)[:, tf.newaxis]
        j = tf.range(sequence_length)
        mask = tf.cast(i >= j, dtype="int32")
        mask = tf.reshape(mask, (1, input_shape[1], input_shape[1]))
        mult = tf.concat(
            [tf.expand_dims(batch_size, -1), tf.constant([1, 1], dtype=tf.int32)],
            axis=0,
        )
        return tf.tile(mask, mult)


def model_class(base, parity):
    class ImageCaptioningModel(base):
        def __init__(
            self,
            cnn_model,
            encoder,
            decoder,
            num_captions_per_image=5,
            image_aug=None,
        ):
            super().__init__()
            self.cnn_model = cnn_model
            self.encoder = encoder
            self.decoder = decoder
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.acc_tracker = keras.metrics.Mean(name="accuracy")
            self.num_captions_per_image = num_captions_per_image
            self.image_aug = image_aug
            if parity:  # changed: Keras's own masked mean, global under keras_ctl
                self.masked_loss = keras.losses.SparseCategoricalCrossentropy(
                    from_logits=False, reduction="mean_with_sample_weight"
                )

        def calculate_loss(self, y_true, y_pred, mask):
            loss = self.loss(y_true, y_pred)
            mask = tf.cast(mask, dtype=loss.dtype)
            loss *= mask
            return tf.reduce_sum(loss) / tf.reduce_sum(mask)

        def calculate_accuracy(self, y_true, y_pred, mask):
            accuracy = tf.equal(y_true, tf.argmax(y_pred, axis=2))
            accuracy = tf.math.logical_and(mask, accuracy)
            accuracy = tf.cast(accuracy, dtype=tf.float32)
            mask = tf.cast(mask, dtype=tf.float32)
            return tf.reduce_sum(accuracy) / tf.reduce_sum(mask)

        if parity:  # changed: both ratios the global batch's

            def calculate_loss(self, y_true, y_pred, mask):
                return self.masked_loss(y_true, y_pred, sample_weight=mask)

            def calculate_accuracy(self, y_true, y_pred, mask):
                accuracy = tf.equal(y_true, tf.argmax(y_pred, axis=2))
                accuracy = tf.math.logical_and(mask, accuracy)
                accuracy = tf.cast(accuracy, dtype=tf.float32)
                mask = tf.cast(mask, dtype=tf.float32)
                return keras_ctl.all_reduce_sum(
                    tf.reduce_sum(accuracy)
                ) / keras_ctl.all_reduce_sum(tf.reduce_sum(mask))

        def _compute_caption_loss_and_acc(self, img_embed, batch_seq, training=True):
            encoder_out = self.encoder(img_embed, training=training)
            batch_seq_inp = batch_seq[:, :-1]
            batch_seq_true = batch_seq[:, 1:]
            mask = tf.math.not_equal(batch_seq_true, 0)
            batch_seq_pred = self.decoder(
                batch_seq_inp, encoder_out, training=training, mask=mask
            )
            loss = self.calculate_loss(batch_seq_true, batch_seq_pred, mask)
            acc = self.calculate_accuracy(batch_seq_true, batch_seq_pred, mask)
            return loss, acc

        def train_step(self, batch_data):
            batch_img, batch_seq = batch_data
            batch_loss = 0
            batch_acc = 0

            if self.image_aug:
                batch_img = self.image_aug(batch_img)

            # 1. Get image embeddings
            img_embed = self.cnn_model(batch_img)

            # 2. Pass each of the five captions one by one to the decoder
            # along with the encoder outputs and compute the loss as well as accuracy
            # for each caption.
            for i in range(self.num_captions_per_image):
                with tf.GradientTape() as tape:
                    loss, acc = self._compute_caption_loss_and_acc(
                        img_embed, batch_seq[:, i, :], training=True
                    )

                    # 3. Update loss and accuracy
                    batch_loss += loss
                    batch_acc += acc

                # 4. Get the list of all the trainable weights
                train_vars = (
                    self.encoder.trainable_variables + self.decoder.trainable_variables
                )

                # 5. Get the gradients
                grads = tape.gradient(loss, train_vars)

                # 6. Update the trainable weights
                self.optimizer.apply_gradients(zip(grads, train_vars))

            # 7. Update the trackers
            batch_acc /= float(self.num_captions_per_image)
            self.loss_tracker.update_state(batch_loss)
            self.acc_tracker.update_state(batch_acc)

            # 8. Return the loss and accuracy values
            return {
                "loss": self.loss_tracker.result(),
                "acc": self.acc_tracker.result(),
            }

        def test_step(self, batch_data):
            batch_img, batch_seq = batch_data
            batch_loss = 0
            batch_acc = 0

            # 1. Get image embeddings
            img_embed = self.cnn_model(batch_img)

            # 2. Pass each of the five captions one by one to the decoder
            # along with the encoder outputs and compute the loss as well as accuracy
            # for each caption.
            for i in range(self.num_captions_per_image):
                loss, acc = self._compute_caption_loss_and_acc(
                    img_embed, batch_seq[:, i, :], training=False
                )

                # 3. Update batch loss and batch accuracy
                batch_loss += loss
                batch_acc += acc

            batch_acc /= float(self.num_captions_per_image)

            # 4. Update the trackers
            self.loss_tracker.update_state(batch_loss)
            self.acc_tracker.update_state(batch_acc)

            # 5. Return the loss and accuracy values
            return {
                "loss": self.loss_tracker.result(),
                "acc": self.acc_tracker.result(),
            }

        if parity:  # changed: written in shares (the accuracy summed across replicas)
            train_step = keras_ctl.written_in_shares(train_step)
            test_step = keras_ctl.written_in_shares(test_step)

        @property
        def metrics(self):
            # We need to list our metrics here so the `reset_states()` can be
            # called automatically.
            return [self.loss_tracker, self.acc_tracker]

    return ImageCaptioningModel


# Learning Rate Scheduler for the optimizer
class LRSchedule(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, post_warmup_learning_rate, warmup_steps):
        super().__init__()
        self.post_warmup_learning_rate = post_warmup_learning_rate
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        global_step = tf.cast(step, tf.float32)
        warmup_steps = tf.cast(self.warmup_steps, tf.float32)
        warmup_progress = global_step / warmup_steps
        warmup_learning_rate = self.post_warmup_learning_rate * warmup_progress
        return tf.cond(
            global_step < warmup_steps,
            lambda: warmup_learning_rate,
            lambda: self.post_warmup_learning_rate,
        )


def captions(rng, count):
    """Token ids as `TextVectorization` gives them: "<start>", 1 to 4 words
    (ids 3 to 19), "<end>", then padding (0) up to `SEQ_LENGTH`."""
    sequences = np.zeros((count, CAPTIONS, SEQ_LENGTH), "int64")
    for row in sequences.reshape(-1, SEQ_LENGTH):
        length = rng.integers(1, SEQ_LENGTH - 1)
        row[0] = START
        row[1 : 1 + length] = rng.integers(3, VOCAB_SIZE, length)
        row[1 + length] = END
    return sequences


def augmented(images, rng):
    """The augmentation's draws, taken in numpy: a horizontal flip and a
    contrast factor in [0.7, 1.3] (the rotation left out)."""
    flipped = np.where(
        rng.random((len(images), 1, 1, 1)) < 0.5, images[:, :, ::-1], images
    )
    mean = flipped.mean(axis=(1, 2), keepdims=True)
    factors = rng.uniform(0.7, 1.3, (len(images), 1, 1, 1))
    return np.clip((flipped - mean) * factors + mean, 0, 255)


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    floatx = keras.config.floatx()
    rng = np.random.default_rng(15)
    images = rng.random((keras_io.SIZE, *IMAGE_SIZE, 3)) * 255
    sequences = captions(rng, keras_io.SIZE)
    if parity:
        train_images = augmented(images, np.random.default_rng(16))
    else:
        train_images = images
    with strategy.scope():
        # Data augmentation for image data
        image_augmentation = keras.Sequential(
            [
                layers.RandomFlip("horizontal"),
                layers.RandomRotation(0.2),
                layers.RandomContrast(0.3),
            ]
        )
        cnn_model = get_cnn_model()
        encoder = TransformerEncoderBlock(
            embed_dim=EMBED_DIM, dense_dim=FF_DIM, num_heads=1
        )
        decoder = TransformerDecoderBlock(
            embed_dim=EMBED_DIM,
            ff_dim=FF_DIM,
            num_heads=2,
            rates=(0.0, 0.0, 0.0) if parity else (0.1, 0.3, 0.5),
        )
        caption_model = model_class(base, parity)(
            cnn_model=cnn_model,
            encoder=encoder,
            decoder=decoder,
            num_captions_per_image=CAPTIONS,
            image_aug=None if parity else image_augmentation,
        )

        # Define the loss function
        cross_entropy = keras.losses.SparseCategoricalCrossentropy(
            from_logits=False,
            reduction=None,
        )
        # Create a learning rate schedule
        num_train_steps = -(-keras_io.SIZE // keras_io.BATCH) * keras_io.EPOCHS
        num_warmup_steps = num_train_steps // 15
        lr_schedule = LRSchedule(
            post_warmup_learning_rate=1e-4, warmup_steps=num_warmup_steps
        )

        # Compile the model
        caption_model.compile(
            optimizer=keras.optimizers.Adam(lr_schedule), loss=cross_entropy
        )
    dataset = tf.data.Dataset.from_tensor_slices(
        (train_images.astype(floatx), sequences)
    ).batch(keras_io.BATCH)
    validation = tf.data.Dataset.from_tensor_slices(
        (images[:9].astype(floatx), sequences[:9])
    ).batch(keras_io.BATCH)
    history = caption_model.fit(
        dataset, epochs=keras_io.EPOCHS, validation_data=validation, verbose=0
    )
    return keras_io.result(caption_model, history)
