"""vision/masked_image_modeling.py: `MaskedAutoencoder(train_augmentation_model,
test_augmentation_model, patch_layer, patch_encoder, encoder, decoder)`,
whose `train_step` and `test_step` augment the images (a random crop and
flip in training), cut them into patches, mask a random 75% of each
image's patches (`PatchEncoder.get_random_indices`: an argsort of
`keras.random.uniform` draws), encode the rest, decode, and take the
`ops.mean` of the squared error over the masked patches; every metric of
`self.metrics` (the compiled loss tracker and `mae`) is updated with
`update_state(loss_patch, loss_output)`, so the logged `loss` is a `Mean`
of the patches weighted by the reconstruction.

The example's Keras 3 version (2026/02/13). Its `train_step` computes the
loss, calls `self.add_loss(total_loss)` and updates the metrics, but never
differentiates or applies an update, so the published model does not
train: the port's `train_step` applies the gradient of `total_loss` to
the trainable variables under a `tf.GradientTape`, as the Keras 2
version's does (marked `# changed`). Also changed: sizes (8x8 images
resized to 12x12 and cropped to 10x10 in training, resized to 10x10 for
testing; 2x2 patches, so 25 patches of which 18 are masked; 8-wide encoder,
4-wide decoder, 2 heads, one block each); the learning-rate schedule's
steps are the tiny run's (published formula: 4 total steps, no warm-up);
no `TrainMonitor` callback and no linear probe. In parity mode the
training augmentation's crop and flip and the masking's uniform draws are
taken from the data (`train()`'s step holds them; the training
augmentation model is then `AugmentedFromData`, which returns the data's
augmented images), and the encoder's and decoder's Dropout rates are 0.0.
On a replica without examples keras_ctl runs a layer called by a step of
one's own on a placeholder row; the layers that take the data's draws give
it a row of zeros (`fitted`).

`PatchEncoder` looks its position embedding up once for the whole batch
(`self.position_embedding(positions[None, ...])`, then tiled); keras_ctl
sums that table's sparse gradient position by position, as one device has
it, so under Keras's sparse Adam parity mode equals one device (float64,
2 replicas: 3.1e-16).
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers
from keras import ops

import keras_io

SOURCE = "examples/vision/masked_image_modeling.py"

# DATA
INPUT_SHAPE = (8, 8, 3)  # changed: (32, 32, 3)

# OPTIMIZER
LEARNING_RATE = 5e-3
WEIGHT_DECAY = 1e-4

# AUGMENTATION
IMAGE_SIZE = 10  # changed: 48
PATCH_SIZE = 2  # changed: 6
NUM_PATCHES = (IMAGE_SIZE // PATCH_SIZE) ** 2
MASK_PROPORTION = 0.75  # We have found 75% masking to give us the best results.
RESIZE = INPUT_SHAPE[0] + 4  # changed: + 20

# ENCODER and DECODER
LAYER_NORM_EPS = 1e-6
ENC_PROJECTION_DIM = 8  # changed: 128
DEC_PROJECTION_DIM = 4  # changed: 64
ENC_NUM_HEADS = 2  # changed: 4
ENC_LAYERS = 1  # changed: 6
DEC_NUM_HEADS = 2  # changed: 4
DEC_LAYERS = 1  # changed: 2
ENC_TRANSFORMER_UNITS = [
    ENC_PROJECTION_DIM * 2,
    ENC_PROJECTION_DIM,
]  # Size of the transformer layers.
DEC_TRANSFORMER_UNITS = [
    DEC_PROJECTION_DIM * 2,
    DEC_PROJECTION_DIM,
]


class Draws(keras_io.DrawsFromData):
    """`DrawsFromData` whose `next()` is `None` when nothing is held: the
    symbolic call Keras makes to build the model draws its own."""

    def next(self):
        held = getattr(self._local, "draws", None)
        return held.pop(0) if held else None


def get_train_augmentation_model():
    model = keras.Sequential(
        [
            layers.Rescaling(1 / 255.0),
            layers.Resizing(RESIZE, RESIZE),  # changed: INPUT_SHAPE[0] + 20
            layers.RandomCrop(IMAGE_SIZE, IMAGE_SIZE),
            layers.RandomFlip("horizontal"),
        ],
        name="train_data_augmentation",
    )
    return model


def get_test_augmentation_model():
    model = keras.Sequential(
        [
            layers.Rescaling(1 / 255.0),
            layers.Resizing(IMAGE_SIZE, IMAGE_SIZE),
        ],
        name="test_data_augmentation",
    )
    return model


def fitted(draw, rows):
    """`draw` with rows of zeros appended up to `rows`. Under several
    replicas a layer called by a step of one's own on a replica without
    examples computes on one placeholder row (keras_ctl), for which the
    data hold no draw; elsewhere `rows` is the draw's own."""
    missing = rows - tf.shape(draw)[0]
    return tf.pad(draw, [[0, missing]] + [[0, 0]] * (draw.shape.rank - 1))


class AugmentedFromData(layers.Layer):
    """Parity mode's training augmentation: the data's augmented images."""

    draws = None

    def call(self, images):
        return fitted(self.draws.next(), tf.shape(images)[0])


class Patches(layers.Layer):
    def __init__(self, patch_size=PATCH_SIZE, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size

        # Reshape the patches to (batch, num_patches, patch_area)
        self.resize = layers.Reshape((-1, patch_size * patch_size * 3))

    def call(self, images):
        # Create patches from the input images
        patches = ops.image.extract_patches(
            images, size=self.patch_size, strides=self.patch_size, padding="valid"
        )

        # Reshape the patches to (batch, num_patches, patch_area) and return it.
        patches = self.resize(patches)
        return patches


class PatchEncoder(layers.Layer):
    draws = None  # changed: the data's draws, in parity mode

    def __init__(
        self,
        patch_size=PATCH_SIZE,
        projection_dim=ENC_PROJECTION_DIM,
        mask_proportion=MASK_PROPORTION,
        downstream=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.patch_size, self.projection_dim = patch_size, projection_dim
        self.mask_proportion, self.downstream = mask_proportion, downstream

        mask_token_shape = (1, patch_size * patch_size * 3)

        # This is a trainable mask token initialized randomly from a normal
        # distribution.
        self.mask_token = keras.Variable(
            keras.random.normal(mask_token_shape),
            trainable=True,
            name="mask_token",
        )

    def build(self, input_shape):
        self.num_patches = input_shape[1] if input_shape[1] is not None else NUM_PATCHES

        # Create the projection layer for the patches.
        self.projection = layers.Dense(units=self.projection_dim)

        # Create the positional embedding layer.
        self.position_embedding = layers.Embedding(
            input_dim=self.num_patches, output_dim=self.projection_dim
        )

        # Number of patches that will be masked.
        self.num_mask = int(self.mask_proportion * self.num_patches)

    def call(self, patches):
        batch_size = ops.shape(patches)[0]
        # Get the positional embeddings.
        positions = ops.arange(start=0, stop=self.num_patches, step=1)
        pos_embeddings = self.position_embedding(positions[None, ...])
        pos_embeddings = ops.tile(
            pos_embeddings, [batch_size, 1, 1]
        )  # (B, num_patches, projection_dim)

        # Embed the patches.
        patch_embeddings = (
            self.projection(patches) + pos_embeddings
        )  # (B, num_patches, projection_dim)

        if self.downstream:
            return patch_embeddings

        mask_indices, unmask_indices = self.get_random_indices(batch_size)
        u_idx, m_idx = unmask_indices[..., None], mask_indices[..., None]
        # The encoder input is the unmasked patch embeddings. Here we gather
        # all the patches that should be unmasked.
        unmasked_embeddings = ops.take_along_axis(
            patch_embeddings, u_idx, axis=1
        )  # (B, unmask_numbers, projection_dim)

        # Get the unmasked and masked position embeddings. We will need them
        # for the decoder.
        unmasked_positions = ops.take_along_axis(
            pos_embeddings, u_idx, axis=1
        )  # (B, unmask_numbers, projection_dim)
        masked_positions = ops.take_along_axis(
            pos_embeddings, m_idx, axis=1
        )  # (B, mask_numbers, projection_dim)

        # Repeat the mask token number of mask times.
        # Mask tokens replace the masks of the image.
        mask_tokens = ops.repeat(self.mask_token, repeats=self.num_mask, axis=0)
        mask_tokens = ops.repeat(mask_tokens[None, ...], repeats=batch_size, axis=0)

        # Get the masked embeddings for the tokens.
        masked_embeddings = self.projection(mask_tokens) + masked_positions
        return (
            unmasked_embeddings,  # Input to the encoder.
            masked_embeddings,  # First part of input to the decoder.
            unmasked_positions,  # Added to the encoder outputs.
            mask_indices,  # The indices that were masked.
            unmask_indices,  # The indices that were unmaksed.
        )

    def get_random_indices(self, batch_size):
        # Create random indices from a uniform distribution and then split
        # it into mask and unmask indices.
        probs = None if self.draws is None else self.draws.next()  # changed
        if probs is None:  # changed: drawn here unless the data hold them
            probs = keras.random.uniform(
                shape=(batch_size, self.num_patches),
            )
        else:  # changed: the data's draws, a row for each of the layer's
            probs = fitted(probs, batch_size)
        rand_indices = ops.argsort(probs, axis=-1)
        mask_indices = rand_indices[:, : self.num_mask]
        unmask_indices = rand_indices[:, self.num_mask :]
        return mask_indices, unmask_indices


def mlp(x, dropout_rate, hidden_units):
    for units in hidden_units:
        x = layers.Dense(units, activation="gelu")(x)
        x = layers.Dropout(dropout_rate)(x)
    return x


def create_encoder(
    num_heads=ENC_NUM_HEADS,
    num_layers=ENC_LAYERS,
    dropout_rate=0.1,  # changed
):
    inputs = layers.Input((None, ENC_PROJECTION_DIM))
    x = inputs

    for _ in range(num_layers):
        # Layer normalization 1.
        x1 = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)(x)

        # Create a multi-head attention layer.
        attention_output = layers.MultiHeadAttention(
            num_heads=num_heads,
            key_dim=ENC_PROJECTION_DIM,
            dropout=dropout_rate,  # changed: 0.1
        )(x1, x1)

        # Skip connection 1.
        x2 = layers.Add()([attention_output, x])

        # Layer normalization 2.
        x3 = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)(x2)

        # MLP.
        x3 = mlp(
            x3, hidden_units=ENC_TRANSFORMER_UNITS, dropout_rate=dropout_rate
        )  # changed: 0.1

        # Skip connection 2.
        x = layers.Add()([x3, x2])

    outputs = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)(x)
    return keras.Model(inputs, outputs, name="mae_encoder")


def create_decoder(
    num_layers=DEC_LAYERS,
    num_heads=DEC_NUM_HEADS,
    image_size=IMAGE_SIZE,
    dropout_rate=0.1,  # changed
):
    inputs = layers.Input((NUM_PATCHES, ENC_PROJECTION_DIM))
    x = layers.Dense(DEC_PROJECTION_DIM)(inputs)

    for _ in range(num_layers):
        # Layer normalization 1.
        x1 = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)(x)

        # Create a multi-head attention layer.
        attention_output = layers.MultiHeadAttention(
            num_heads=num_heads,
            key_dim=DEC_PROJECTION_DIM,
            dropout=dropout_rate,  # changed: 0.1
        )(x1, x1)
        # Skip connection .
        x2 = layers.Add()([attention_output, x])

        x3 = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)(x2)
        # MLP.
        x3 = mlp(
            x3, hidden_units=DEC_TRANSFORMER_UNITS, dropout_rate=dropout_rate
        )  # changed: 0.1

        # Skip connection 2.
        x = layers.Add()([x3, x2])

    x = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)(x)
    x = layers.Flatten()(x)
    pre_final = layers.Dense(units=image_size * image_size * 3, activation="sigmoid")(x)
    outputs = layers.Reshape((image_size, image_size, 3))(pre_final)

    return keras.Model(inputs, outputs, name="mae_decoder")


def model_class(base):
    class MaskedAutoencoder(base):
        def __init__(
            self,
            train_augmentation_model,
            test_augmentation_model,
            patch_layer,
            patch_encoder,
            encoder,
            decoder,
            **kwargs,
        ):
            super().__init__(**kwargs)
            self.train_augmentation_model = train_augmentation_model
            self.test_augmentation_model = test_augmentation_model
            self.patch_layer = patch_layer
            self.patch_encoder = patch_encoder
            self.encoder = encoder
            self.decoder = decoder

        def calculate_loss(self, images, training=True):
            # Augment the input images.
            augmented_images = (
                self.train_augmentation_model(images)
                if training
                else self.test_augmentation_model(images)
            )

            # Patch the augmented images.
            patches = self.patch_layer(augmented_images)

            # Encode the patches.
            (
                unmasked_embeddings,
                masked_embeddings,
                unmasked_positions,
                mask_indices,
                unmask_indices,
            ) = self.patch_encoder(patches)

            # Pass the unmasked patches to the encoder.
            encoder_outputs = self.encoder(unmasked_embeddings)

            # Create the decoder inputs.
            encoder_outputs = encoder_outputs + unmasked_positions
            decoder_inputs = ops.concatenate(
                [encoder_outputs, masked_embeddings], axis=1
            )

            # Decode the inputs.
            decoder_outputs = self.decoder(decoder_inputs)
            decoder_patches = self.patch_layer(decoder_outputs)

            # Extract only the masked patches using ops.take_along_axis
            m_idx = mask_indices[..., None]
            loss_patch = ops.take_along_axis(patches, m_idx, axis=1)
            loss_output = ops.take_along_axis(decoder_patches, m_idx, axis=1)

            # Compute the total loss.
            total_loss = ops.mean(ops.square(loss_patch - loss_output))

            return total_loss, loss_patch, loss_output

        def call(self, images, training=False):
            # A call method to build/trace the model
            _, _, loss_output = self.calculate_loss(images, training=training)
            return loss_output

        def train_step(self, data):
            images = data[0] if isinstance(data, (list, tuple)) else data
            with tf.GradientTape() as tape:  # changed: the Keras 2 version's update
                total_loss, loss_patch, loss_output = self.calculate_loss(
                    images, training=True
                )
            gradients = tape.gradient(total_loss, self.trainable_variables)  # changed
            self.optimizer.apply_gradients(  # changed
                zip(gradients, self.trainable_variables)
            )

            self.add_loss(total_loss)
            results = {}
            for metric in self.metrics:
                metric.update_state(loss_patch, loss_output)
                results[metric.name] = metric.result()

            if "loss" not in results:
                results["loss"] = total_loss

            return results

        def test_step(self, data):
            if isinstance(data, (list, tuple)):
                images = data[0]
            else:
                images = data

            total_loss, loss_patch, loss_output = self.calculate_loss(
                images, training=False
            )

            # Update the trackers.
            results = {}
            for metric in self.metrics:
                metric.update_state(loss_patch, loss_output)
                results[metric.name] = metric.result()

            if "loss" not in results:
                results["loss"] = total_loss

            return results

    return MaskedAutoencoder


class WarmUpCosine(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(
        self, learning_rate_base, total_steps, warmup_learning_rate, warmup_steps
    ):
        super().__init__()

        self.learning_rate_base = learning_rate_base
        self.total_steps = total_steps
        self.warmup_learning_rate = warmup_learning_rate
        self.warmup_steps = warmup_steps

        self.pi = ops.convert_to_tensor(np.pi, dtype="float32")

    def __call__(self, step):
        step = ops.cast(step, dtype="float32")
        if self.total_steps < self.warmup_steps:
            raise ValueError("Total_steps must be larger or equal to warmup_steps.")

        # proper Warmup Rate
        cos_annealed_lr = ops.cos(
            self.pi
            * (step - self.warmup_steps)
            / float(self.total_steps - self.warmup_steps)
        )

        learning_rate = 0.5 * self.learning_rate_base * (1 + cos_annealed_lr)

        if self.warmup_steps > 0:
            if self.learning_rate_base < self.warmup_learning_rate:
                raise ValueError(
                    "Learning_rate_base must be larger or equal to warmup_learning_rate."
                )
            slope = (
                self.learning_rate_base - self.warmup_learning_rate
            ) / self.warmup_steps

            warmup_rate = slope * step + self.warmup_learning_rate

            learning_rate = ops.where(
                step < self.warmup_steps, warmup_rate, learning_rate
            )

        return ops.where(step > self.total_steps, 0.0, learning_rate)


def augmented(images, rng):
    """The training augmentation's draws, taken in numpy: rescaled and
    resized as the model does, then a random crop and horizontal flip."""
    resized = np.asarray(layers.Resizing(RESIZE, RESIZE)(images / 255.0))
    offsets = rng.integers(0, RESIZE - IMAGE_SIZE + 1, (len(images), 2))
    crops = np.stack(
        [
            image[top : top + IMAGE_SIZE, left : left + IMAGE_SIZE]
            for image, (top, left) in zip(resized, offsets)
        ]
    )
    flipped = np.where(
        rng.random((len(images), 1, 1, 1)) < 0.5, crops[:, :, ::-1], crops
    )
    return flipped.astype(keras.config.floatx())


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    floatx = keras.config.floatx()
    rng = np.random.default_rng(13)
    images = (rng.random((keras_io.SIZE, *INPUT_SHAPE)) * 255).astype(floatx)
    draws = Draws()

    class Trained(model_class(base)):
        def train_step(self, data):
            if not parity:
                return super().train_step(data)
            images, augmented_images, probs = data
            draws.hold([augmented_images, probs])
            return super().train_step((images,))

        def test_step(self, data):
            if not parity:
                return super().test_step(data)
            images, probs = data
            draws.hold([probs])
            return super().test_step((images,))

    with strategy.scope():
        if parity:  # changed: the augmented images from the data
            train_augmentation_model = AugmentedFromData()
            train_augmentation_model.draws = draws
        else:
            train_augmentation_model = get_train_augmentation_model()
        test_augmentation_model = get_test_augmentation_model()
        patch_layer = Patches()

        patch_encoder = PatchEncoder(
            patch_size=PATCH_SIZE,
            projection_dim=ENC_PROJECTION_DIM,
            mask_proportion=MASK_PROPORTION,
        )
        if parity:
            patch_encoder.draws = draws
        dropout_rate = 0.0 if parity else 0.1
        encoder = create_encoder(dropout_rate=dropout_rate)
        decoder = create_decoder(dropout_rate=dropout_rate)

        mae_model = Trained(
            train_augmentation_model=train_augmentation_model,
            test_augmentation_model=test_augmentation_model,
            patch_layer=patch_layer,
            patch_encoder=patch_encoder,
            encoder=encoder,
            decoder=decoder,
        )

        total_steps = int((keras_io.SIZE / keras_io.BATCH) * keras_io.EPOCHS)
        warmup_epoch_percentage = 0.15
        warmup_steps = int(total_steps * warmup_epoch_percentage)
        scheduled_lrs = WarmUpCosine(
            learning_rate_base=LEARNING_RATE,
            total_steps=total_steps,
            warmup_learning_rate=0.0,
            warmup_steps=warmup_steps,
        )
        optimizer = keras.optimizers.Adam(
            learning_rate=scheduled_lrs, weight_decay=WEIGHT_DECAY
        )

        # Compile and pretrain the model.
        mae_model.compile(
            optimizer=optimizer, loss=keras.losses.MeanSquaredError(), metrics=["mae"]
        )
    validation_images = images[:9]
    if parity:
        draws_rng = np.random.default_rng(14)
        data = (
            images,
            augmented(images, draws_rng),
            draws_rng.random((keras_io.SIZE, NUM_PATCHES)).astype(floatx),
        )
        validation = (
            validation_images,
            draws_rng.random((len(validation_images), NUM_PATCHES)).astype(floatx),
        )
    else:
        data, validation = (images,), (validation_images,)
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(keras_io.BATCH)
    val_ds = tf.data.Dataset.from_tensor_slices(validation).batch(keras_io.BATCH)
    history = mae_model.fit(
        dataset, epochs=keras_io.EPOCHS, validation_data=val_ds, verbose=0
    )
    return keras_io.result(mae_model, history)
