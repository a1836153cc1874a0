"""The wheel a user installs: typed, with its metadata, and nothing of the
repository's own (benchmarks, documentation sources, tests)."""

import email
import zipfile

import children


def test_the_wheel_is_typed_and_holds_only_the_package(tmp_path):
    build = [children.PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path]
    result = children.run([*build, children.ROOT], timeout=300, cwd=tmp_path)
    assert result.returncode == 0, children.output(result)
    (wheel,) = tmp_path.glob("keras_ctl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "keras_ctl/py.typed" in names
    tops = {name.split("/")[0] for name in names if "/" in name}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"keras_ctl"}
    modules = {name for name in names if "/" not in name}
    assert modules == {"keras_ctl_cli.py", "keras_ctl_launch.py"}
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    fields = email.message_from_bytes(zipfile.ZipFile(wheel).read(metadata))
    classifiers = fields.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "docs" in fields.get_all("Provides-Extra")
