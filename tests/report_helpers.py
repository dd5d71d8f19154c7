"""Shared by the HTML report tests: parsing inline SVG, and a headless Chromium."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET

import pytest

SVG = "{http://www.w3.org/2000/svg}"


def svgs(page: str) -> list[ET.Element]:
    """Every inline SVG, parsed as XML (which also proves each one is well formed)."""
    return [ET.fromstring(m) for m in re.findall(r"<svg\b.*?</svg>", page, flags=re.S)]


def by_class(root: ET.Element, cls: str) -> list[ET.Element]:
    return [el for el in root.iter() if cls in (el.get("class") or "").split()]


def headless_chromium():
    """A headless Chromium driven by chromedriver, or a skip that says what is missing.

    The browser log ("goog:loggingPrefs") is on, so a test can read the console."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[dev]')")
    chromium = next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p),
        None,
    )
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip(
            "chromium or chromedriver not found: run `make browser` "
            "(Debian: apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=options)


def console_errors(driver) -> list[dict]:
    """Errors on the browser console since the last read (reading clears the log)."""
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
