"""audio/transformer_asr.py: `Transformer(...)`, a sequence-to-sequence
Transformer whose `train_step` and `test_step` take a dict batch
(`source`, `target`), calls the model without a `training` argument, and
compute a masked loss with `self.compute_loss(None, one_hot, preds,
sample_weight=mask)`: the compiled `CategoricalCrossentropy`
(`label_smoothing=0.1`) with the padding mask as sample weights, a
`sum_over_batch_size` reduction that divides by every target token, padded
or not. A `Mean` tracker of its own logs the loss.

Its steps have no random draws as written (the model is called without
`training`, so its Dropout layers do not drop, and the encoder passes
`training=False` on), so parity mode is the step as written. The example's
Keras 3 version (`import keras`, `self.compute_loss(...)` for Keras 2's
`self.compiled_loss(...)`). Changed: sizes (16 frames of 4 features, 6
target tokens of a 10-token vocabulary, 8 hidden units, 16 feed-forward,
2 heads, 1 encoder and 1 decoder layer); the learning-rate schedule warms
up over 2 epochs of 3 steps (published: 15 epochs of `len(ds)` steps), so
the 2 epochs train at 1e-5 then 1e-3; no `DisplayOutputs` callback.

`TokenEmbedding` looks its position embedding up once for the whole batch
(`self.pos_emb(tf.range(maxlen))`); keras_ctl sums that table's sparse
gradient position by position, as one device has it, so under Keras's
sparse Adam the example equals one device (float64, 2 replicas: 4.5e-15).
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import keras_io

SOURCE = "examples/audio/transformer_asr.py"

SOURCE_FRAMES, FEATURES, TARGET_LEN, CLASSES = 16, 4, 6, 10


class TokenEmbedding(layers.Layer):
    def __init__(self, num_vocab=1000, maxlen=100, num_hid=64):
        super().__init__()
        self.emb = keras.layers.Embedding(num_vocab, num_hid)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=num_hid)

    def call(self, x):
        maxlen = tf.shape(x)[-1]
        x = self.emb(x)
        positions = tf.range(start=0, limit=maxlen, delta=1)
        positions = self.pos_emb(positions)
        return x + positions


class SpeechFeatureEmbedding(layers.Layer):
    def __init__(self, num_hid=64, maxlen=100):
        super().__init__()
        self.conv1 = keras.layers.Conv1D(
            num_hid, 11, strides=2, padding="same", activation="relu"
        )
        self.conv2 = keras.layers.Conv1D(
            num_hid, 11, strides=2, padding="same", activation="relu"
        )
        self.conv3 = keras.layers.Conv1D(
            num_hid, 11, strides=2, padding="same", activation="relu"
        )

    def call(self, x):
        x = self.conv1(x)
        x = self.conv2(x)
        return self.conv3(x)


class TransformerEncoder(layers.Layer):
    def __init__(self, embed_dim, num_heads, feed_forward_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [
                layers.Dense(feed_forward_dim, activation="relu"),
                layers.Dense(embed_dim),
            ]
        )
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs, training=False):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
        return self.layernorm2(out1 + ffn_output)


class TransformerDecoder(layers.Layer):
    def __init__(self, embed_dim, num_heads, feed_forward_dim, dropout_rate=0.1):
        super().__init__()
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm3 = layers.LayerNormalization(epsilon=1e-6)
        self.self_att = layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=embed_dim
        )
        self.enc_att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.self_dropout = layers.Dropout(0.5)
        self.enc_dropout = layers.Dropout(0.1)
        self.ffn_dropout = layers.Dropout(0.1)
        self.ffn = keras.Sequential(
            [
                layers.Dense(feed_forward_dim, activation="relu"),
                layers.Dense(embed_dim),
            ]
        )

    def causal_attention_mask(self, batch_size, n_dest, n_src, dtype):
        """Masks the upper half of the dot product matrix in self attention.

        This prevents flow of information from future tokens to current token.
        1's in the lower triangle, counting from the lower right corner.
        """
        i = tf.range(n_dest)[:, None]
        j = tf.range(n_src)
        m = i >= j - n_src + n_dest
        mask = tf.cast(m, dtype)
        mask = tf.reshape(mask, [1, n_dest, n_src])
        mult = tf.concat(
            [tf.expand_dims(batch_size, -1), tf.constant([1, 1], dtype=tf.int32)], 0
        )
        return tf.tile(mask, mult)

    def call(self, enc_out, target):
        input_shape = tf.shape(target)
        batch_size = input_shape[0]
        seq_len = input_shape[1]
        causal_mask = self.causal_attention_mask(batch_size, seq_len, seq_len, tf.bool)
        target_att = self.self_att(target, target, attention_mask=causal_mask)
        target_norm = self.layernorm1(target + self.self_dropout(target_att))
        enc_out = self.enc_att(target_norm, enc_out)
        enc_out_norm = self.layernorm2(self.enc_dropout(enc_out) + target_norm)
        ffn_out = self.ffn(enc_out_norm)
        ffn_out_norm = self.layernorm3(enc_out_norm + self.ffn_dropout(ffn_out))
        return ffn_out_norm


def model_class(base):
    class Transformer(base):
        def __init__(
            self,
            num_hid=64,
            num_head=2,
            num_feed_forward=128,
            source_maxlen=100,
            target_maxlen=100,
            num_layers_enc=4,
            num_layers_dec=1,
            num_classes=10,
        ):
            super().__init__()
            self.loss_metric = keras.metrics.Mean(name="loss")
            self.num_layers_enc = num_layers_enc
            self.num_layers_dec = num_layers_dec
            self.target_maxlen = target_maxlen
            self.num_classes = num_classes

            self.enc_input = SpeechFeatureEmbedding(
                num_hid=num_hid, maxlen=source_maxlen
            )
            self.dec_input = TokenEmbedding(
                num_vocab=num_classes, maxlen=target_maxlen, num_hid=num_hid
            )

            self.encoder = keras.Sequential(
                [self.enc_input]
                + [
                    TransformerEncoder(num_hid, num_head, num_feed_forward)
                    for _ in range(num_layers_enc)
                ]
            )

            for i in range(num_layers_dec):
                setattr(
                    self,
                    f"dec_layer_{i}",
                    TransformerDecoder(num_hid, num_head, num_feed_forward),
                )

            self.classifier = layers.Dense(num_classes)

        def decode(self, enc_out, target):
            y = self.dec_input(target)
            for i in range(self.num_layers_dec):
                y = getattr(self, f"dec_layer_{i}")(enc_out, y)
            return y

        def call(self, inputs):
            source = inputs[0]
            target = inputs[1]
            x = self.encoder(source)
            y = self.decode(x, target)
            return self.classifier(y)

        @property
        def metrics(self):
            return [self.loss_metric]

        def train_step(self, batch):
            """Processes one batch inside model.fit()."""
            source = batch["source"]
            target = batch["target"]
            dec_input = target[:, :-1]
            dec_target = target[:, 1:]
            with tf.GradientTape() as tape:
                preds = self([source, dec_input])
                one_hot = tf.one_hot(dec_target, depth=self.num_classes)
                mask = tf.math.logical_not(tf.math.equal(dec_target, 0))
                loss = self.compute_loss(None, one_hot, preds, sample_weight=mask)
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)
            self.optimizer.apply_gradients(zip(gradients, trainable_vars))
            self.loss_metric.update_state(loss)
            return {"loss": self.loss_metric.result()}

        def test_step(self, batch):
            source = batch["source"]
            target = batch["target"]
            dec_input = target[:, :-1]
            dec_target = target[:, 1:]
            preds = self([source, dec_input])
            one_hot = tf.one_hot(dec_target, depth=self.num_classes)
            mask = tf.math.logical_not(tf.math.equal(dec_target, 0))
            loss = self.compute_loss(None, one_hot, preds, sample_weight=mask)
            self.loss_metric.update_state(loss)
            return {"loss": self.loss_metric.result()}

    return Transformer


class CustomSchedule(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(
        self,
        init_lr=0.00001,
        lr_after_warmup=0.001,
        final_lr=0.00001,
        warmup_epochs=15,
        decay_epochs=85,
        steps_per_epoch=203,
    ):
        super().__init__()
        self.init_lr = init_lr
        self.lr_after_warmup = lr_after_warmup
        self.final_lr = final_lr
        self.warmup_epochs = warmup_epochs
        self.decay_epochs = decay_epochs
        self.steps_per_epoch = steps_per_epoch

    def calculate_lr(self, epoch):
        """linear warm up - linear decay"""
        warmup_lr = (
            self.init_lr
            + ((self.lr_after_warmup - self.init_lr) / (self.warmup_epochs - 1)) * epoch
        )
        decay_lr = tf.math.maximum(
            self.final_lr,
            self.lr_after_warmup
            - (epoch - self.warmup_epochs)
            * (self.lr_after_warmup - self.final_lr)
            / self.decay_epochs,
        )
        return tf.math.minimum(warmup_lr, decay_lr)

    def __call__(self, step):
        epoch = step // self.steps_per_epoch
        epoch = tf.cast(epoch, "float32")
        return self.calculate_lr(epoch)


def transcripts(rng, count):
    """Token sequences of `TARGET_LEN`: "<" (2), 1 to 4 characters, ">" (3),
    then padding (0), as `VectorizeChar` makes them."""
    target = np.zeros((count, TARGET_LEN), "int32")
    for row, length in zip(target, rng.integers(1, TARGET_LEN - 1, count)):
        row[0] = 2
        row[1 : 1 + length] = rng.integers(4, CLASSES, length)
        row[1 + length] = 3
    return target


def train(base, strategy, parity=True):
    del parity  # no random draws: the same steps in both modes
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(11)
    floatx = keras.config.floatx()
    source = rng.normal(size=(keras_io.SIZE, SOURCE_FRAMES, FEATURES)).astype(floatx)
    target = transcripts(rng, keras_io.SIZE)
    dataset = tf.data.Dataset.from_tensor_slices(
        {"source": source, "target": target}
    ).batch(keras_io.BATCH)
    validation = tf.data.Dataset.from_tensor_slices(
        {"source": source[:9], "target": target[:9]}
    ).batch(keras_io.BATCH)
    with strategy.scope():
        model = model_class(base)(
            num_hid=8,
            num_head=2,
            num_feed_forward=16,
            target_maxlen=TARGET_LEN,
            num_layers_enc=1,
            num_layers_dec=1,
            num_classes=CLASSES,
        )
        loss_fn = keras.losses.CategoricalCrossentropy(
            from_logits=True,
            label_smoothing=0.1,
        )
        learning_rate = CustomSchedule(
            init_lr=0.00001,
            lr_after_warmup=0.001,
            final_lr=0.00001,
            warmup_epochs=2,
            decay_epochs=85,
            steps_per_epoch=len(dataset),
        )
        optimizer = keras.optimizers.Adam(learning_rate)
        model.compile(optimizer=optimizer, loss=loss_fn)
    history = model.fit(
        dataset, validation_data=validation, epochs=keras_io.EPOCHS, verbose=0
    )
    return keras_io.result(model, history)
