"""The playground page in a real headless browser (the system's Chromium, driven by Selenium):
type a prompt, start, wait; the step view shows accepted and rejected drafts, and the text equals
the API's answer to the same request. Skipped, saying why, where no browser is installed."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

import quickdraft
from quickdraft.serve import create_app
from quickdraft.serve.background import BackgroundServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from playground_browser import decode_on_page, missing, open_browser  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.skipif(missing() is not None, reason=str(missing()))]
PROMPT = "Summarize: The cat sat on the mat. The cat was happy on the mat because the mat was warm."


@pytest.fixture(scope="module")
def server():
    decoder = quickdraft.load(method="prompt-lookup", backend="native")
    running = BackgroundServer(create_app(decoder, max_batch=4))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def browser():
    driver = open_browser()
    yield driver
    driver.quit()


def api_answer(server, method: str, max_tokens: int) -> str:
    body = {
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "quickdraft": {"method": method},
    }
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]["message"][
        "content"
    ]


def test_the_page_shows_every_pass_and_ends_with_the_apis_text(server, browser, tmp_path):
    from selenium.webdriver.common.by import By

    decode_on_page(browser, server.url, PROMPT, "lookahead", 40)
    assert browser.find_element(By.ID, "status").text == "done"
    steps = browser.find_element(By.ID, "speculative")
    assert steps.find_elements(By.CSS_SELECTOR, ".step .accepted"), "no accepted draft shown"
    assert steps.find_elements(By.CSS_SELECTOR, ".step .rejected"), "no rejected draft shown"
    assert steps.find_elements(By.CSS_SELECTOR, ".step .recovered, .step .bonus")
    text = browser.find_element(By.ID, "speculative-text").text
    assert text and text == api_answer(server, "lookahead", 40).strip()
    assert "tokens per pass" in browser.find_element(By.ID, "speculative-stats").text
    browser.save_screenshot(str(tmp_path / "playground.png"))
    assert (tmp_path / "playground.png").stat().st_size > 10_000


def test_race_mode_decodes_plainly_beside_the_speculative_run(server, browser):
    from selenium.webdriver.common.by import By

    decode_on_page(browser, server.url, PROMPT, "lookahead", 24, race=True)
    status = browser.find_element(By.ID, "status").text
    assert status.startswith("done: lookahead") and "plain" in status
    plain = browser.find_element(By.ID, "plain")
    assert plain.is_displayed() and plain.find_elements(By.CSS_SELECTOR, ".target")
    assert not plain.find_elements(By.CSS_SELECTOR, ".accepted, .rejected")  # plain decoding drafts nothing
    assert browser.find_element(By.ID, "plain-text").text == browser.find_element(By.ID, "speculative-text").text
    assert browser.find_element(By.ID, "plain-clock").text.endswith(" s")
