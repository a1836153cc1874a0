"""keras-hub task models that override `compute_loss`, trained with CTLModel.

keras-hub 0.32 has task models whose `compute_loss` is their own (most
call `super().compute_loss(...)` with targets they build): RetinaNet,
BASNet, SigLIP, RQ-VAE (a loss of shape `(1,)`), PARSeq and D-FINE. Each is
built small from its constructors (no presets, no downloads, no
preprocessor), converted with `keras_ctl.CTLModel.from_model`, trained with
`fit()` for 2 epochs with validation data and an uneven last batch under
`--strategy`, and compared with the same model as a plain `keras.Model` on
one device (no strategy): every logged key (train and `val_`) and every
weight at the end must agree.

Under 2 replicas (`mirrored`, 2 logical CPUs) a loss that couples the
examples of a batch (a normalizer counted over the batch, an eye(batch)
target, a Hungarian matching over the batch's boxes) or a layer that updates
state from each replica's batch is known to differ from one device: for
those the measured difference is written down (`expected_to_differ`, with
`keras_ctl.testing.known_to_differ(model)`) and not asserted.

With `--compute-loss-over global_batch` the CTLModel is compiled with
`compute_loss_over="global_batch"`: each `compute_loss`, as shipped, sees
every replica's rows, and the losses that couple the batch equal one
device's; only a layer that updates state from each replica's batch
(RQ-VAE's codebook) is still known to differ.

    python .ci/keras_hub_models.py --strategy mirrored --out runs/mirrored.json

Exits 1 when a model differs where it should not, or crashes.
"""

import argparse
import contextlib
import json
import os
import sys
import traceback

import numpy as np

SEED = 7
EPOCHS = 2
ROWS, VAL_ROWS, BATCH = 14, 6, 4  # batches of 4, 4, 4, 2: the last is partial
LEARNING_RATE = 1e-3
# float32 round-off: one device vs one device, and vs 2 replicas.
TOLERANCE = {"none": 1e-5, "onedevice": 1e-5, "mirrored": 1e-4}
# float64 (`--floatx float64`) tells logic from round-off: 2 replicas too.
TOLERANCE_FLOAT64 = 1e-9
# What each model's loss or layers do with the examples of a batch that 2
# replicas cannot reproduce (each sees half the batch).
BATCH_COUPLED = {
    "retinanet": "loss normalized by the positive anchors of the batch",
    "siglip": "eye(batch) targets: each replica's logits are its own half",
    "rqvae": "ops.mean over the replica's batch; EMA codebook of its batch",
    "d_fine": "Hungarian matching and num_boxes over the replica's batch",
}
# What still differs when `compute_loss` sees the global batch. RetinaNet's
# first epoch agrees to 2e-6 (float32 round-off) and drifts to 1e-3 in the
# second; float64 cannot tell (keras.Model's RetinaNet fails to train in
# float64: "one_step_on_data(data) should not modify its Python input").
STATE_COUPLED = {
    "rqvae": "EMA codebook updated from the replica's batch",
    "retinanet": "float32 round-off through the focal loss, not separable",
}
# Models that plain keras.Model cannot train under 2 replicas either: not
# run there. BASNet aborts the process inside TensorFlow ("double free or
# corruption") under MirroredStrategy on 2 logical CPUs, stock Keras too.
KERAS_CANNOT = {"mirrored": {"basnet"}}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--strategy", choices=["none", "onedevice", "mirrored"], default="none"
    )
    parser.add_argument(
        "--compute-loss-over",
        choices=["replica_batch", "global_batch"],
        default="replica_batch",
    )
    parser.add_argument("--out", required=True, help="JSON file to write.")
    parser.add_argument("--models", nargs="*", help="Only these models.")
    # One floatx per process: Keras keeps building float32 weights after a
    # float32 model once existed in the process.
    parser.add_argument("--floatx", choices=["float32", "float64"], default="float32")
    return parser.parse_args()


def configure_devices(strategy_name):
    """2 logical CPUs for `mirrored`: before TensorFlow sets up its devices."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    if strategy_name == "mirrored":
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )


def make_strategy(strategy_name):
    import tensorflow as tf

    if strategy_name == "onedevice":
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    if strategy_name == "mirrored":
        return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    return None


# --- Small models and their data -------------------------------------------


def tiny_resnet(stacks):
    import keras_hub

    return keras_hub.models.ResNetBackbone(
        input_conv_filters=[64],  # the first stack's width: 64 is required
        input_conv_kernel_sizes=[3],
        stackwise_num_filters=[64] + [8] * (stacks - 1),
        stackwise_num_blocks=[1] * stacks,
        stackwise_num_strides=[1] + [2] * (stacks - 1),
        block_type="basic_block",
        use_pre_activation=False,
    )


def build_retinanet():
    import keras_hub

    backbone = keras_hub.models.RetinaNetBackbone(
        image_encoder=tiny_resnet(3), min_level=3, max_level=4, use_p5=False
    )
    return keras_hub.models.RetinaNetObjectDetector(
        backbone=backbone,
        num_classes=3,
        bounding_box_format="yxyx",
        pre_logits_num_conv_layers=1,
        preprocessor=None,
    )


def data_retinanet(rng, rows):
    # Boxes of 20-36 pixels in a 64x64 image overlap level-3 anchors (32 px).
    images = rng.uniform(0, 1, (rows, 64, 64, 3)).astype("float32")
    top_left = rng.uniform(0, 24, (rows, 2, 2))
    size = rng.uniform(20, 36, (rows, 2, 2))
    boxes = np.concatenate([top_left, np.minimum(top_left + size, 64)], axis=-1)
    labels = rng.integers(0, 3, (rows, 2)).astype("float32")
    labels[::3, 1] = -1  # padding box: no object
    y = {"boxes": boxes.astype("float32"), "labels": labels}
    return images, y, None


def build_basnet():
    import keras_hub

    backbone = keras_hub.models.BASNetBackbone(
        image_encoder=tiny_resnet(4),
        num_classes=1,
        image_shape=(32, 32, 3),
        projection_filters=64,  # the width of the ResNet stacks it reuses
    )
    return keras_hub.models.BASNetImageSegmenter(backbone, preprocessor=None)


def data_basnet(rng, rows):
    images = rng.uniform(0, 1, (rows, 32, 32, 3)).astype("float32")
    masks = (rng.uniform(0, 1, (rows, 32, 32, 1)) > 0.5).astype("float32")
    return images, masks, None


def build_siglip():
    import keras_hub

    vision = keras_hub.models.SigLIPVisionEncoder(
        patch_size=8,
        hidden_dim=8,
        num_layers=1,
        num_heads=2,
        intermediate_dim=16,
        image_shape=(16, 16, 3),
    )
    text = keras_hub.models.SigLIPTextEncoder(
        vocabulary_size=20,
        embedding_dim=8,
        hidden_dim=8,
        num_layers=1,
        num_heads=2,
        intermediate_dim=16,
        max_sequence_length=6,
    )
    return keras_hub.models.SigLIPBackbone(vision_encoder=vision, text_encoder=text)


def data_siglip(rng, rows):
    x = {
        "images": rng.uniform(0, 1, (rows, 16, 16, 3)).astype("float32"),
        "token_ids": rng.integers(1, 20, (rows, 6)).astype("int32"),
    }
    return x, None, None


def build_rqvae():
    from keras_hub.src.models.rqvae.rqvae_backbone import RQVAEBackbone

    return RQVAEBackbone(
        input_dim=6,
        encoder_layer_dims=[8],
        output_dim=4,
        decoder_layer_dims=[8],
        num_embeddings=8,
        num_quantizers=2,
    )


def data_rqvae(rng, rows):
    return rng.normal(size=(rows, 6)).astype("float32"), None, None


PARSEQ_LENGTH, PARSEQ_VOCAB = 5, 10


def build_parseq():
    import keras_hub

    encoder = keras_hub.models.ViTBackbone(
        image_shape=(8, 16, 3),
        patch_size=(4, 4),
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        mlp_dim=16,
        use_class_token=False,
    )
    backbone = keras_hub.models.PARSeqBackbone(
        image_encoder=encoder,
        vocabulary_size=PARSEQ_VOCAB,
        max_label_length=PARSEQ_LENGTH,
        decoder_hidden_dim=8,
        num_decoder_layers=1,
        num_decoder_heads=2,
        decoder_mlp_dim=16,
        dropout_rate=0.0,
        attention_dropout=0.0,
    )
    # num_perms=2: the forward permutation and its mirror, no random draws.
    return keras_hub.models.PARSeqCausalLM(
        preprocessor=None, backbone=backbone, num_perms=2, compile=False
    )


def data_parseq(rng, rows):
    lengths = rng.integers(2, PARSEQ_LENGTH + 1, rows)
    padding = np.arange(PARSEQ_LENGTH)[None, :] < lengths[:, None]
    labels = rng.integers(1, PARSEQ_VOCAB - 2, (rows, PARSEQ_LENGTH))
    labels[np.arange(rows), lengths - 1] = 0  # the end token
    tokens = np.concatenate(
        [np.full((rows, 1), PARSEQ_VOCAB - 2), labels[:, :-1]], axis=1
    )
    x = {
        "images": rng.uniform(0, 1, (rows, 8, 16, 3)).astype("float32"),
        "token_ids": (tokens * padding).astype("int32"),
        "padding_mask": padding.astype("int32"),
    }
    return x, (labels * padding).astype("int32"), padding.astype("float32")


def build_d_fine():
    import keras_hub

    image_encoder = keras_hub.models.HGNetV2Backbone(
        stem_channels=[3, 8, 8],
        stackwise_stage_filters=[[8, 8, 16, 1, 1, 3], [16, 8, 32, 1, 1, 3]],
        apply_downsample=[False, True],
        use_lightweight_conv_block=[False, False],
        depths=[1, 1],
        hidden_sizes=[16, 32],
        embedding_size=8,
        use_learnable_affine_block=True,
        hidden_act="relu",
        image_shape=(None, None, 3),
        out_features=["stage1", "stage2"],
        data_format="channels_last",
    )
    backbone = keras_hub.models.DFineBackbone(
        backbone=image_encoder,
        decoder_in_channels=[16, 16],
        encoder_hidden_dim=16,
        num_denoising=0,
        num_labels=3,
        hidden_dim=16,
        learn_initial_query=False,
        num_queries=6,
        anchor_image_size=(32, 32),
        feat_strides=[4, 8],
        num_feature_levels=2,
        encoder_in_channels=[16, 32],
        encode_proj_layers=[1],
        num_attention_heads=2,
        encoder_ffn_dim=32,
        num_encoder_layers=1,
        hidden_expansion=0.5,
        depth_multiplier=0.5,
        eval_idx=-1,
        num_decoder_layers=1,
        decoder_attention_heads=2,
        decoder_ffn_dim=32,
        decoder_method="default",
        decoder_n_points=[2, 2],
        lqe_hidden_dim=16,
        num_lqe_layers=1,
        out_features=["stage1", "stage2"],
        image_shape=(32, 32, 3),
        data_format="channels_last",
        seed=0,
    )
    return keras_hub.models.DFineObjectDetector(
        backbone=backbone, num_classes=3, bounding_box_format="yxyx"
    )


def data_d_fine(rng, rows):
    # Targets as the preprocessor leaves them: relative center_xywh boxes.
    images = rng.uniform(0, 1, (rows, 32, 32, 3)).astype("float32")
    center = rng.uniform(0.3, 0.7, (rows, 1, 2))
    size = rng.uniform(0.1, 0.4, (rows, 1, 2))
    boxes = np.concatenate([center, size], axis=-1).astype("float32")
    labels = rng.integers(0, 3, (rows, 1)).astype("int32")
    return images, {"boxes": boxes, "labels": labels}, None


# name: (build, data, compile arguments besides the optimizer)
CASES = {
    "retinanet": (build_retinanet, data_retinanet, {}),
    "basnet": (build_basnet, data_basnet, {"metrics": ["binary_accuracy"]}),
    "siglip": (build_siglip, data_siglip, {}),
    "rqvae": (build_rqvae, data_rqvae, {}),
    "parseq": (build_parseq, data_parseq, {"loss": "sparse_ce_from_logits"}),
    "d_fine": (build_d_fine, data_d_fine, {}),
}


def compile_arguments(extra):
    import keras

    extra = dict(extra)
    if extra.get("loss") == "sparse_ce_from_logits":
        extra["loss"] = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return extra


# --- Training and comparing -------------------------------------------------


def synchronize_batch_norm(model):
    """BatchNorm of the global batch: without it 2 replicas differ by design."""
    import keras

    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.synchronized = True


def train(name, strategy, convert, compute_loss_over="replica_batch"):
    """Builds `name` from the seed, trains it, returns (model, logs, weights)."""
    import keras

    build, make_data, extra = CASES[name]
    keras.utils.set_random_seed(SEED)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = build()
        synchronize_batch_norm(model)
        options = compile_arguments(extra)
        if convert:
            import keras_ctl

            model = keras_ctl.CTLModel.from_model(model)
            options["compute_loss_over"] = compute_loss_over
        model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE), **options)
    rng = np.random.default_rng(SEED)  # the same data for every run
    x, y, weights = in_floatx(make_data(rng, ROWS))
    val = in_floatx(make_data(rng, VAL_ROWS))
    history = model.fit(
        x,
        y,
        sample_weight=weights,
        validation_data=val if val[1] is not None else (val[0],),
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
    )
    values = [np.asarray(v.numpy()) for v in model.weights]
    return model, history.history, values


def in_floatx(data):
    import keras

    def cast(array):
        floating = array is not None and array.dtype == np.float32
        return array.astype(keras.config.floatx()) if floating else array

    return tuple(keras.tree.map_structure(cast, part) for part in data)


def relative(a, b):
    a, b = np.asarray(a, "float64"), np.asarray(b, "float64")
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-12)))


def compare(reference, run, tolerance):
    """Differences of logs (relative, per key) and weights (absolute)."""
    ref_logs, logs = reference[1], run[1]
    per_key = {
        key: relative(ref_logs[key], logs[key]) for key in ref_logs if key in logs
    }
    weights = max(
        (float(np.max(np.abs(a - b))) for a, b in zip(reference[2], run[2])),
        default=0.0,
    )
    problems = [f"missing key {k}" for k in ref_logs if k not in logs]
    problems += [f"extra key {k}" for k in logs if k not in ref_logs]
    problems += [
        f"{k}: {ref_logs[k]} (keras.Model) vs {logs[k]} (CTLModel)"
        for k, d in per_key.items()
        if not d <= tolerance
    ]
    if len(reference[2]) != len(run[2]):
        problems.append(f"{len(reference[2])} vs {len(run[2])} weights")
    elif not weights <= tolerance:
        problems.append(f"weights differ by {weights:.3g}")
    return {
        "keys": sorted(ref_logs),
        "max_relative_log_difference": per_key,
        "max_abs_weight_difference": weights,
        "problems": problems,
    }


def check(name, strategy_name, strategy, tolerance, compute_loss_over):
    """One model: keras.Model on no strategy vs CTLModel under `strategy`."""
    import keras_ctl.testing

    reference = train(name, None, convert=False)
    run = train(name, strategy, convert=True, compute_loss_over=compute_loss_over)
    result = compare(reference, run, tolerance)
    result["known_to_differ"] = [
        f"{where}: {why}" for where, why in keras_ctl.testing.known_to_differ(run[0])
    ]
    coupled = BATCH_COUPLED if compute_loss_over == "replica_batch" else STATE_COUPLED
    if strategy_name == "mirrored" and name in coupled:
        result["status"] = "expected_to_differ" if result["problems"] else "pass"
        result["expected_to_differ"] = coupled[name]
    else:
        result["status"] = "fail" if result["problems"] else "pass"
    return result


def write(args, tolerance, results):
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    summary = {
        "strategy": args.strategy,
        "floatx": args.floatx,
        "compute_loss_over": args.compute_loss_over,
    }
    with open(args.out, "w") as f:
        json.dump({**summary, "tolerance": tolerance, "models": results}, f, indent=2)


def main():
    args = parse_args()
    configure_devices(args.strategy)
    import keras

    keras.config.set_floatx(args.floatx)
    tolerance = TOLERANCE[args.strategy]
    if args.floatx == "float64":
        tolerance = TOLERANCE_FLOAT64
    strategy = make_strategy(args.strategy)
    results = {}
    for name in args.models or CASES:
        if name in KERAS_CANNOT.get(args.strategy, ()):
            results[name] = {"status": "not run: keras.Model cannot either"}
            print(name, results[name]["status"], flush=True)
            continue
        try:
            results[name] = check(
                name, args.strategy, strategy, tolerance, args.compute_loss_over
            )
        except Exception as error:  # a crash is a failure, with its reason
            results[name] = {
                "status": "crash",
                "error": f"{type(error).__name__}: {error}"[:2000],
                "traceback": traceback.format_exc()[-4000:],
            }
        print(name, results[name]["status"], flush=True)
        write(args, tolerance, results)  # so far: a native crash loses no result
    failed = [n for n, r in results.items() if r["status"] in ("fail", "crash")]
    if failed:
        print("unexpected failures:", ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
