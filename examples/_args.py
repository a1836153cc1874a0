"""Command-line flags shared by the examples: every count must be >= 1."""

import argparse


def parse_args(doc, *, replicas, epochs, out, extra=()):
    """Parses `--replicas`, `--epochs`, `--out` and `extra` integer flags.

    Args:
        doc: The example's docstring; its first line describes the example.
        replicas, epochs, out: Defaults of the common flags.
        extra: `(flag, default, help)` of further integer flags.
    """
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=replicas)
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--out", default=out)
    for flag, default, text in extra:
        parser.add_argument(flag, type=int, default=default, help=text)
    args = parser.parse_args()
    for name, value in vars(args).items():
        if isinstance(value, int) and value < 1:
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} must be >= 1. Received: {flag} {value}")
    return args
