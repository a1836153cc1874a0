"""keras_rs/sequential_retrieval.py (GRU4Rec): `SequentialRetrievalModel`,
a GRU query tower over a user's past movies and an embedding candidate
tower, whose `compute_loss` scores every query against every candidate of
the batch (labels `ops.eye(num_queries, num_candidates)`: the batch's
other movies are the negatives), with a `keras_rs.layers.BruteForceRetrieval`
that `call` runs outside training.

Changed: sizes (30 movies, contexts of 5 padded with 0 at the end, 4-wide
embeddings) and generated MovieLens-like data in place of MovieLens 1M;
`fit` without the validation data, whose top-k retrieval is not training;
a learning rate of 0.005 (at 0.05 AdamW's near-sign first updates of
4-wide embeddings carry float32 round-off to 4e-5 in two epochs; float64
is exact at either).

As written, under R replicas each replica's `compute_loss` takes its
negatives from its own examples. Parity mode compiles the `CTLModel` with
`compute_loss_over="global_batch"`: the unchanged `compute_loss` is given
the global batch, and the weights and `loss` equal one device's on 2 and
3 replicas: AdamW's sparse update of the candidate embeddings looked up
for the gathered labels included.
"""

import keras
import keras_rs
import numpy as np

import keras_io

SOURCE = "examples/keras_rs/sequential_retrieval.py"

MOVIES, MAX_CONTEXT_LENGTH, EMBEDDING_DIM, LEARNING_RATE = 30, 5, 4, 0.005


def model_class(base):
    class SequentialRetrievalModel(base):
        """Create the sequential retrieval model.

        Args:
          movies_count: Total number of unique movies in the dataset.
          embedding_dimension: Output dimension for movie embedding tables.
        """

        def __init__(
            self,
            movies_count,
            embedding_dimension=128,
            **kwargs,
        ):
            super().__init__(**kwargs)
            # Our query tower, simply an embedding table followed by
            # a GRU unit. This encodes sequence of historical movies.
            self.query_model = keras.Sequential(
                [
                    keras.layers.Embedding(movies_count + 1, embedding_dimension),
                    keras.layers.GRU(embedding_dimension),
                ]
            )

            # Our candidate tower, simply an embedding table.
            self.candidate_model = keras.layers.Embedding(
                movies_count + 1, embedding_dimension
            )

            # The layer that performs the retrieval.
            self.retrieval = keras_rs.layers.BruteForceRetrieval(
                k=10, return_scores=False
            )
            self.loss_fn = keras.losses.CategoricalCrossentropy(
                from_logits=True,
            )

        def build(self, input_shape):
            self.query_model.build(input_shape)
            self.candidate_model.build(input_shape)

            # In this case, the candidates are directly the movie embeddings.
            # We take a shortcut and directly reuse the variable.
            self.retrieval.candidate_embeddings = self.candidate_model.embeddings
            self.retrieval.build(input_shape)
            super().build(input_shape)

        def call(self, inputs, training=False):
            query_embeddings = self.query_model(inputs)
            result = {
                "query_embeddings": query_embeddings,
            }

            if not training:
                # Skip the retrieval of top movies during training as the
                # predictions are not used.
                result["predictions"] = self.retrieval(query_embeddings)
            return result

        def compute_loss(self, x, y, y_pred, sample_weight, training=True):
            candidate_id = y
            query_embeddings = y_pred["query_embeddings"]
            candidate_embeddings = self.candidate_model(candidate_id)

            num_queries = keras.ops.shape(query_embeddings)[0]
            num_candidates = keras.ops.shape(candidate_embeddings)[0]

            # One-hot vectors for labels.
            labels = keras.ops.eye(num_queries, num_candidates)

            # Compute the affinity score by multiplying the two embeddings.
            scores = keras.ops.matmul(
                query_embeddings, keras.ops.transpose(candidate_embeddings)
            )

            return self.loss_fn(labels, scores, sample_weight)

    return SequentialRetrievalModel


def examples(rng):
    """Contexts of the movies a user watched (ids 1 to MOVIES, 1 to
    MAX_CONTEXT_LENGTH of them, padded with 0 at the end) and the next
    movie as the label."""
    lengths = rng.integers(1, MAX_CONTEXT_LENGTH + 1, keras_io.SIZE)
    movies = rng.integers(1, MOVIES + 1, (keras_io.SIZE, MAX_CONTEXT_LENGTH))
    padding = np.arange(MAX_CONTEXT_LENGTH) >= lengths[:, None]
    contexts = np.where(padding, 0, movies).astype("int32")
    labels = rng.integers(1, MOVIES + 1, keras_io.SIZE).astype("int32")
    return contexts, labels


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    contexts, labels = examples(np.random.default_rng(2))
    with strategy.scope():
        model = model_class(base)(
            movies_count=MOVIES + 1, embedding_dimension=EMBEDDING_DIM
        )
        options = {}
        if parity and base is not keras.Model:  # changed: the global batch's loss
            options["compute_loss_over"] = "global_batch"
        model.compile(
            optimizer=keras.optimizers.AdamW(learning_rate=LEARNING_RATE), **options
        )
    history = model.fit(
        contexts,
        labels,
        batch_size=keras_io.BATCH,
        epochs=keras_io.EPOCHS,
        shuffle=False,
        verbose=0,
    )
    return keras_io.result(model, history)
