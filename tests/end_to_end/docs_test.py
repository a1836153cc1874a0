"""The documentation site: every page's code runs, the site builds with
warnings as errors, and a real headless Chromium renders it."""

import functools
import http.server
import os
import shutil
import sys
import threading

import children
import doc_pages
import pytest


@pytest.mark.parametrize("page", doc_pages.pages())
def test_page_code_runs(page, tmp_path):
    doc_pages.run_page(page, tmp_path, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built with warnings as errors."""
    folder = tmp_path_factory.mktemp("site")
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", folder]
    result = children.run(mkdocs, timeout=300, cwd=children.ROOT)
    assert result.returncode == 0, children.output(result)
    return folder


@pytest.fixture(scope="module")
def served(site):
    """The site on http://127.0.0.1:<a free port>/, stopped after the tests."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=site)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Debian's headless Chromium, driven through its ChromeDriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, (
        "The docs' browser test drives Chromium and ChromeDriver from the system "
        "packages: `apt-get install chromium chromium-driver` (.ci/run does)."
    )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)
    session = webdriver.Chrome(options=options, service=Service(driver))
    session.set_page_load_timeout(60)
    yield session
    session.quit()


SHOWN = """
const text = (selector) => [...document.querySelectorAll(selector)]
    .map((element) => element.textContent);
const pictures = [...document.querySelectorAll("article img")];
return {
    ready: document.readyState === "complete" && pictures.every((i) => i.complete),
    title: document.title,
    headings: text("article h1, article h2, article h3"),
    code: text("article pre code"),
    pictures: pictures.map((img) => [img.getAttribute("src"), img.naturalWidth]),
};
"""


def rendered(browser, url):
    """What the page at `url` shows once loaded, pictures included: its
    title, headings, code and pictures (source, width in pixels)."""
    from selenium.webdriver.support.wait import WebDriverWait

    browser.get(url)
    return WebDriverWait(browser, 60).until(
        lambda b: (shown := b.execute_script(SHOWN))["ready"] and shown
    )


def test_the_start_page_renders_its_quickstart_and_picture(browser, served):
    page = rendered(browser, served)
    assert page["title"].startswith("keras_ctl")
    assert any("local_mirrored_strategy(2)" in code for code in page["code"])
    assert page["pictures"] == [["assets/weight_difference.png", 600]]


def test_a_guide_renders_its_code(browser, served):
    page = rendered(browser, served + "guides/custom-step/")
    assert page["headings"][0].startswith("Moving a custom step")
    assert any("class CustomModel(base)" in code for code in page["code"])
    assert any("assert difference < 1e-5" in code for code in page["code"])


def test_an_api_page_renders_signatures_from_the_code(browser, served):
    page = rendered(browser, served + "reference/ctl-model/")
    headings = " ".join(page["headings"])
    for method in ("from_model", "compile", "fit", "compute_loss", "save"):
        assert method in headings
    browser.find_element("id", "keras_ctl.CTLModel.fit")  # an anchor per method
    signatures = " ".join(page["code"])
    assert "gradient_accumulation" in signatures and "batch_size" in signatures


def test_the_benchmark_page_shows_every_chart(browser, served):
    page = rendered(browser, served + "benchmarks/")
    charts = sorted(os.listdir(os.path.join(children.ROOT, "benchmarks", "results")))
    shown = [src.rsplit("/", 1)[-1] for src, width in page["pictures"] if width > 0]
    assert shown == [name for name in charts if name.endswith(".png")]
