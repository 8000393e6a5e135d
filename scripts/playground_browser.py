"""Drive the playground page in a headless Chromium (the operating system's package, through
Selenium): tests/test_playground.py and scripts/playground_screenshot.py share this."""

from __future__ import annotations

import shutil

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver",)


def missing() -> str | None:
    """Why no headless browser can run here (None: one can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium==4.40.0)"
    if not any(shutil.which(name) for name in BROWSERS):
        return "no Chromium here (Debian: apt-get install chromium chromium-driver; setup.sh does it as root)"
    if not any(shutil.which(name) for name in DRIVERS):
        return "no chromedriver here (Debian: apt-get install chromium-driver)"
    return None


def open_browser(width: int = 1400, height: int = 1000):
    """A headless Chromium driven by Selenium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = next(shutil.which(name) for name in BROWSERS if shutil.which(name))
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))


def decode_on_page(
    driver,
    url: str,
    prompt: str,
    method: str,
    max_tokens: int,
    race: bool = False,
    k: int | None = None,
    timeout: float = 300,
) -> None:
    """Open the page, fill the controls, start (or race) and wait until the status says done."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver.get(url + "/")
    wait = WebDriverWait(driver, timeout)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#method option")) > 0)
    for field, value in (
        ("prompt", prompt),
        ("max-tokens", str(max_tokens)),
        ("temperature", "0"),
        ("k", "" if k is None else str(k)),
    ):
        element = driver.find_element(By.ID, field)
        element.clear()
        element.send_keys(value)
    Select(driver.find_element(By.ID, "method")).select_by_value(method)
    driver.find_element(By.ID, "race" if race else "start").click()
    wait.until(
        lambda d: (
            d.find_element(By.ID, "status").text.startswith(("done", "error"))
            or "error" in d.find_element(By.ID, "status").get_attribute("class")
        )
    )
