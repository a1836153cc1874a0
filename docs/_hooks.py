"""Pages made from files outside `docs/`, so that they never go stale.

- `changelog.md` is `CHANGELOG.md`;
- `benchmarks.md` is followed by `benchmarks/README.md` and every table and
  chart in `benchmarks/results/`.
"""

import pathlib

from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def on_files(files, config):
    for chart in sorted(RESULTS.glob("*.png")):
        files.append(
            File.generated(config, f"benchmarks/{chart.name}", abs_src_path=str(chart))
        )
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "changelog.md":
        return (ROOT / "CHANGELOG.md").read_text()
    if page.file.src_uri == "benchmarks.md":
        return markdown + "\n" + _benchmark_results()
    return markdown


def _benchmark_results():
    reading = (ROOT / "benchmarks" / "README.md").read_text()
    parts = [_demote(reading)]
    for table in sorted(RESULTS.glob("*.md")):
        parts.append(f"## `results/{table.name}`\n\n{table.read_text()}")
        chart = table.with_suffix(".png")
        if chart.exists():
            parts.append(f"![{chart.stem}](benchmarks/{chart.name})")
    return "\n\n".join(parts)


def _demote(markdown):
    # The benchmark README's title becomes a section of this page.
    return "\n".join(
        "#" + line if line.startswith("#") else line for line in markdown.splitlines()
    )
