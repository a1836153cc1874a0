"""keras_rs/multi_task.py: `MultiTaskModel`, user and movie embeddings for
retrieval (every user scored against every movie of the batch, labels
`ops.eye(num_users, num_candidates)`, a `reduction="sum"` cross-entropy)
and a rating model for ranking (mean squared error), one weighted loss in
its own `compute_loss`, and a `compute_metrics` of its own (RMSE in
training, top-k accuracy of a `keras_rs.layers.BruteForceRetrieval` outside
it).

Changed: sizes (20 users, 30 movies, 4-wide embeddings, a rating model of
8 and 4 units) and generated MovieLens-like ratings in place of MovieLens
100K; the multi-task model of the three (both loss weights 1), `fit` only:
the example's `evaluate()` and retrieval are not training.

As written, under R replicas each replica's `compute_loss` takes its
negatives from its own examples. Parity mode compiles the `CTLModel` with
`compute_loss_over="global_batch"`: the unchanged `compute_loss` is given
the global batch, and the weights and the logs (`loss` and
`root_mean_squared_error`, without the top-k accuracy its
`compute_metrics` pops) equal one device's on 2 and 3 replicas.
"""

import keras
import keras_rs
import numpy as np

import keras_io

SOURCE = "examples/keras_rs/multi_task.py"

USERS, MOVIES = 20, 30


def model_class(base):
    class MultiTaskModel(base):
        def __init__(
            self,
            num_users,
            num_candidates,
            embedding_dimension=32,
            layer_sizes=(256, 128),
            retrieval_loss_wt=1.0,
            ranking_loss_wt=1.0,
            **kwargs,
        ):
            super().__init__(**kwargs)
            # Our query tower, simply an embedding table.
            self.user_embedding = keras.layers.Embedding(num_users, embedding_dimension)

            # Our candidate tower, simply an embedding table.
            self.candidate_embedding = keras.layers.Embedding(
                num_candidates, embedding_dimension
            )

            # Rating model.
            self.rating_model = keras.Sequential(
                [
                    keras.layers.Dense(layer_size, activation="relu")
                    for layer_size in layer_sizes
                ]
                + [keras.layers.Dense(1)]
            )

            # The layer that performs the retrieval.
            self.retrieval = keras_rs.layers.BruteForceRetrieval(
                k=10, return_scores=False
            )

            self.retrieval_loss_fn = keras.losses.CategoricalCrossentropy(
                from_logits=True,
                reduction="sum",
            )
            self.ranking_loss_fn = keras.losses.MeanSquaredError()

            # Top-k accuracy for retrieval
            self.top_k_metric = keras.metrics.SparseTopKCategoricalAccuracy(
                k=10, from_sorted_ids=True
            )
            # RMSE for ranking
            self.rmse_metric = keras.metrics.RootMeanSquaredError()

            # Attributes.
            self.num_users = num_users
            self.num_candidates = num_candidates
            self.embedding_dimension = embedding_dimension
            self.layer_sizes = layer_sizes
            self.retrieval_loss_wt = retrieval_loss_wt
            self.ranking_loss_wt = ranking_loss_wt

        def build(self, input_shape):
            self.user_embedding.build(input_shape)
            self.candidate_embedding.build(input_shape)
            # In this case, the candidates are directly the movie embeddings.
            # We take a shortcut and directly reuse the variable.
            self.retrieval.candidate_embeddings = self.candidate_embedding.embeddings
            self.retrieval.build(input_shape)

            self.rating_model.build((None, 2 * self.embedding_dimension))

            super().build(input_shape)

        def call(self, inputs, training=False):
            # Unpack inputs. Note that we have the if condition throughout this
            # `call()` method so that we can do a `.predict()` for the retrieval
            # task.
            user_id = inputs["user_id"]
            if "movie_id" in inputs:
                movie_id = inputs["movie_id"]

            result = {}

            # Get user, movie embeddings.
            user_embeddings = self.user_embedding(user_id)
            result["user_embeddings"] = user_embeddings

            if "movie_id" in inputs:
                candidate_embeddings = self.candidate_embedding(movie_id)
                result["candidate_embeddings"] = candidate_embeddings

                # Pass both embeddings through the rating block of the model.
                rating = self.rating_model(
                    keras.ops.concatenate(
                        [user_embeddings, candidate_embeddings], axis=1
                    )
                )
                result["rating"] = rating

            if not training:
                # Skip the retrieval of top movies during training as the
                # predictions are not used.
                result["predictions"] = self.retrieval(user_embeddings)

            return result

        def compute_loss(self, x, y, y_pred, sample_weight, training=True):
            user_embeddings = y_pred["user_embeddings"]
            candidate_embeddings = y_pred["candidate_embeddings"]

            # 1. Retrieval

            # Compute the affinity score by multiplying the two embeddings.
            scores = keras.ops.matmul(
                user_embeddings,
                keras.ops.transpose(candidate_embeddings),
            )

            # Retrieval labels: One-hot vectors
            num_users = keras.ops.shape(user_embeddings)[0]
            num_candidates = keras.ops.shape(candidate_embeddings)[0]
            retrieval_labels = keras.ops.eye(num_users, num_candidates)
            # Retrieval loss
            retrieval_loss = self.retrieval_loss_fn(
                retrieval_labels, scores, sample_weight
            )

            # 2. Ranking
            ratings = y
            pred_rating = y_pred["rating"]

            # Ranking labels are just ratings.
            ranking_labels = keras.ops.expand_dims(ratings, -1)
            # Ranking loss
            ranking_loss = self.ranking_loss_fn(
                ranking_labels, pred_rating, sample_weight
            )

            # Total loss is a weighted combination of the two losses.
            total_loss = (
                self.retrieval_loss_wt * retrieval_loss
                + self.ranking_loss_wt * ranking_loss
            )

            return total_loss

        def compute_metrics(self, x, y, y_pred, sample_weight=None):
            # RMSE can be computed irrespective of whether we are
            # training/evaluating.
            self.rmse_metric.update_state(
                y,
                y_pred["rating"],
                sample_weight=sample_weight,
            )

            if "predictions" in y_pred:
                # We are evaluating or predicting. Update `top_k_metric`.
                movie_ids = x["movie_id"]
                predictions = y_pred["predictions"]
                # For `top_k_metric`, which is a `SparseTopKCategoricalAccuracy`,
                # we only take top rated movies, and we put a weight of 0 for
                # the rest.
                rating_weight = keras.ops.cast(keras.ops.greater(y, 0.9), "float32")
                sample_weight = (
                    rating_weight
                    if sample_weight is None
                    else keras.ops.multiply(rating_weight, sample_weight)
                )
                self.top_k_metric.update_state(
                    movie_ids, predictions, sample_weight=sample_weight
                )

                return self.get_metrics_result()
            else:
                # We are training. `top_k_metric` is not updated and is zero, so
                # don't report it.
                result = self.get_metrics_result()
                result.pop(self.top_k_metric.name)
                return result

    return MultiTaskModel


def ratings(rng):
    """(user, movie) pairs and their rating of 1 to 5 stars, mapped to
    [0, 1] as the example does."""
    x = {
        "user_id": rng.integers(1, USERS + 1, keras_io.SIZE).astype("int32"),
        "movie_id": rng.integers(1, MOVIES + 1, keras_io.SIZE).astype("int32"),
    }
    stars = rng.integers(1, 6, keras_io.SIZE)
    return x, ((stars - 1.0) / 4.0).astype(keras.config.floatx())


def train(base, strategy, parity=True):
    keras.utils.set_random_seed(0)
    x, y = ratings(np.random.default_rng(3))
    with strategy.scope():
        model = model_class(base)(
            num_users=USERS + 1,
            num_candidates=MOVIES + 1,
            embedding_dimension=4,
            layer_sizes=(8, 4),
            ranking_loss_wt=1.0,
            retrieval_loss_wt=1.0,
        )
        options = {}
        if parity and base is not keras.Model:  # changed: the global batch's loss
            options["compute_loss_over"] = "global_batch"
        model.compile(optimizer=keras.optimizers.Adagrad(0.1), **options)
    history = model.fit(
        x,
        y,
        batch_size=keras_io.BATCH,
        epochs=keras_io.EPOCHS,
        shuffle=False,
        verbose=0,
    )
    return keras_io.result(model, history)
