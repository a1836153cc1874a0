"""The Keras and TensorFlow versions keras_ctl supports, checked on import.

The ranges are declared once, in pyproject.toml (`keras` in the dependencies,
TensorFlow in the `cpu` extra), and read back from the installed package's
metadata here, before Keras or TensorFlow is imported.
"""

from importlib import metadata

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

# The distributions of each package a user may bring; each shares one version
# line (keras-nightly 3.16.0.dev... is Keras 3.16 to come).
_DISTRIBUTIONS = {
    "keras": ("keras", "keras-nightly"),
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-macos", "tf-nightly"),
}


def supported_ranges() -> dict[str, SpecifierSet]:
    """`{"keras": SpecifierSet, "tensorflow": SpecifierSet}` from the metadata.

    Empty when keras_ctl runs from a source tree that is not installed.
    """
    try:
        requirements = metadata.requires("keras-ctl") or []
    except metadata.PackageNotFoundError:
        return {}
    ranges: dict[str, SpecifierSet] = {}
    for text in requirements:
        requirement = Requirement(text)
        if requirement.name == "keras":
            ranges["keras"] = requirement.specifier
        elif requirement.name == "tensorflow-cpu":
            ranges["tensorflow"] = requirement.specifier
    return ranges


def installed_version(name: str) -> Version | None:
    """The installed version of `name` (any of its distributions)."""
    for distribution in _DISTRIBUTIONS.get(name, (name,)):
        try:
            return Version(metadata.version(distribution))
        except metadata.PackageNotFoundError:
            continue
    return None


def check_versions() -> None:
    """Raises `ImportError` when the installed Keras or TensorFlow is outside
    the supported range, naming both."""
    for name, specifier in supported_ranges().items():
        version = installed_version(name)
        if version is None:
            continue  # Importing it fails next, with its own message.
        # Compare release numbers: 2.21.0rc1 belongs to the 2.21 line.
        if Version(version.base_version) not in specifier:
            raise ImportError(
                f"keras_ctl supports {name}{specifier}. Received: {name} "
                f"{version} installed. Install a supported version, e.g. "
                f"`pip install '{name}{specifier}'`, or a keras_ctl release "
                f"made for {name} {version}."
            )
