"""The reports in a real browser: headless Chromium loads them, with no console error.

Needs Debian's ``chromium`` (``.ci/run`` installs it where it can) and the
``playwright`` package, which drives that system browser (it downloads none).
Without either the tests skip and say which is missing.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compare.conftest import run_cli
from tests.report.conftest import FAULT, IMG_FACT, SCRIPT_NAME

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (the system's), driven by playwright."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium): browser test skipped")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')"
    )
    with sync_api.sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start;
        # containers give /dev/shm a few MB, too little for Chromium's shared memory
        chromium = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield chromium
        chromium.close()


class Loaded:
    """A page opened from a file, with every console error, page error and dialog it raised."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("request", lambda r: self.requests.append(r.url))

        def dialog(d: Any) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        self.page.on("dialog", dialog)
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_load_state("load")

    def fetched_elsewhere(self) -> list[str]:
        """Requests for anything but the file itself and inline data."""
        return [u for u in self.requests if not u.startswith(("file://", "data:"))]


def _compare_html(golden: Path, actual: Path, out: Path, capsys: Any) -> Path:
    code, _, _ = run_cli(["compare", str(golden), str(actual), "--html", str(out)], capsys)
    assert code == 1
    return out


def test_comparison_report_loads_cleanly_and_shows_the_first_divergence(
    browser: Any, llama_runs: tuple[Path, Path], tmp_path: Path, capsys: Any
) -> None:
    page = _compare_html(*llama_runs, tmp_path / "compare.html", capsys)
    shown = Loaded(browser, page)
    box = shown.page.locator("#first-divergence")
    assert box.is_visible()
    assert FAULT.module in box.inner_text()
    assert shown.page.get_by_text("First divergence", exact=True).is_visible()
    # every "jump to" link lands on a section of the page
    links = shown.page.locator("nav a")
    assert links.count() >= 4
    for i in range(links.count()):
        assert shown.page.locator(links.nth(i).get_attribute("href")).count() == 1
    # the records table sorts and filters
    table = shown.page.locator("#records")
    table.locator("th", has_text="error").first.click()
    table.locator("th", has_text="error").first.click()  # descending: largest error first
    # the largest error is downstream of the fault, carried on and explained there (it
    # passes under the expected-error judge); sorting changed the order, and the failing
    # record is in the table
    rows = table.locator("tbody tr")
    before = rows.first.inner_text()
    table.locator("th", has_text="error").first.click()
    assert rows.first.inner_text() != before
    assert table.locator("tbody tr[data-status=fail]").count() >= 1
    shown.page.fill("[data-filter-for=records] input", "input_layernorm")
    visible = table.locator("tbody tr:visible")
    assert 0 < visible.count() < table.locator("tbody tr").count()
    assert all("input_layernorm" in t for t in visible.all_inner_texts())
    shot = tmp_path / "compare.png"
    shown.page.screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shown.errors == []
    assert shown.fetched_elsewhere() == []


def test_hostile_names_do_not_run_in_the_browser(
    browser: Any, hostile_runs: tuple[Path, Path], tmp_path: Path, capsys: Any
) -> None:
    page = _compare_html(*hostile_runs, tmp_path / "hostile.html", capsys)
    shown = Loaded(browser, page)
    assert shown.dialogs == []  # neither alert(1) nor alert(2) ran
    assert SCRIPT_NAME in shown.page.locator("#first-divergence").inner_text()
    assert IMG_FACT in shown.page.inner_text("body")
    assert shown.errors == []
    assert shown.fetched_elsewhere() == []


def test_diagnosis_report_loads_cleanly_with_root_causes_visible(
    browser: Any, tmp_path: Path, capsys: Any
) -> None:
    page = tmp_path / "check.html"
    code, _, _ = run_cli(
        ["check", "-d", "emu:fp16", "--only", "rope.position_sweep", "--html", str(page)], capsys
    )
    assert code == 1
    shown = Loaded(browser, page)
    causes = shown.page.locator("#root-causes")
    assert causes.is_visible()
    assert "rope.position_sweep" in causes.inner_text()
    assert shown.page.locator(".finding svg").first.is_visible()
    shown.page.screenshot(path=str(tmp_path / "check.png"), full_page=True)
    assert shown.errors == []
    assert shown.fetched_elsewhere() == []
