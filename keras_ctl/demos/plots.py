"""PNG files: learning curves and grids of generated images (matplotlib)."""


def pyplot():
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            "Plots need matplotlib, which is not installed. Install it with "
            "`pip install 'keras-ctl[examples]'`."
        ) from error
    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def learning_curves(history, path, title=""):
    """Writes one panel per logged value (with its `val_` twin) to `path`,
    under `title` (say, the model, the strategy and the replicas)."""
    figure = curves_figure(history, title)
    figure.savefig(path, dpi=80)
    pyplot().close(figure)


def curves_figure(history, title=""):
    """The figure of `learning_curves`: epochs 1, 2, ... on integer ticks."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    names = [name for name in history if not name.startswith("val_")]
    figure, axes = plt.subplots(
        1, len(names), figsize=(4 * len(names), 3), squeeze=False
    )
    for axis, name in zip(axes[0], names):
        epochs = range(1, len(history[name]) + 1)
        axis.plot(epochs, history[name], marker="o", label=name)
        if f"val_{name}" in history:
            axis.plot(epochs, history[f"val_{name}"], marker="o", label=f"val_{name}")
        if len(epochs) <= 10:
            axis.set_xticks(list(epochs))
        else:
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlabel("epoch")
        axis.set_ylabel(name)
        axis.set_title(name)
        axis.legend()
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def image_grid(images, path, title=""):
    """Writes up to 16 images `(n, h, w, channels)` in [0, 1] as a 4x4 grid."""
    plt = pyplot()
    figure, axes = plt.subplots(4, 4, figsize=(4, 4))
    for axis in axes.flat:
        axis.axis("off")
    for image, axis in zip(images[:16], axes.flat):
        axis.imshow(image[..., 0], cmap="gray", vmin=0.0, vmax=1.0)
    figure.suptitle(title)
    figure.savefig(path, dpi=50)
    plt.close(figure)


def image_grid_callback(folder, latents):
    """A callback writing `folder/samples_epoch_NNN.png` from `model(latents)`."""
    import keras

    class ImageGrid(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            images = keras.ops.convert_to_numpy(self.model(latents))
            name = f"samples_epoch_{epoch + 1:03d}.png"
            image_grid(images.astype("float32"), folder / name, f"epoch {epoch + 1}")

    return ImageGrid()
