"""A real headless Chromium (the Debian ``chromium`` and ``chromium-driver`` packages, which
``scripts/services.sh`` installs) driven through WebDriver, and screenshots kept for a look."""

from __future__ import annotations

import contextlib
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--window-size=1400,900",
)
#: Screenshots of every browser test, kept after the run (the directory is ignored by git).
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@contextlib.contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    """A headless Chromium, quit afterwards. Missing packages fail the test (never skip)."""
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        pytest.fail(f"{CHROMIUM} and {CHROMEDRIVER} are required (run scripts/services.sh)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    # Script errors on the page are read back with get_log("browser").
    options.set_capability("goog:loggingPrefs", {"browser": "SEVERE"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def page_errors(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    """Script errors the page logged (SEVERE console entries)."""
    entries: list[dict[str, Any]] = driver.get_log("browser")  # type: ignore[no-untyped-call]
    return entries


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    """Save a PNG of the window under ``test-artifacts/`` and check it is a real image of the
    window's size with more than a blank page in it."""
    png = driver.get_screenshot_as_png()
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 800 and height >= 600, (width, height)
    assert len(png) > 10_000, "the screenshot is (nearly) blank"
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.png"
    path.write_bytes(png)
    return path
