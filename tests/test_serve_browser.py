"""The playground in a real browser: headless Chromium (Debian's chromium + chromium-driver, installed by
``make browser``) driven by Selenium types a chat message, sees the streamed answer appear, and saves a
screenshot. Skipped only when Chromium is not installed (with how to install it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
webdriver = pytest.importorskip("selenium.webdriver")

import serve_helpers as sh  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
SCREENSHOT_DIR = os.environ.get("LMFORGE_SCREENSHOTS")  # keep the screenshot somewhere to look at


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = sh.ThreadServer({"gpt": sh.gpt_folder(tmp_path_factory.mktemp("browser"))})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def base_server(tmp_path_factory):
    """A base decoder alone: no chat template (as ``lmforge pretrain`` leaves it), no index."""
    folder = sh.gpt_folder(tmp_path_factory.mktemp("browser-base"))
    (folder / "chat_template.json").unlink()
    s = sh.ThreadServer({"base": folder})
    yield s
    s.stop()


@pytest.fixture
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("Chromium is not installed: run `make browser` (apt-get install chromium chromium-driver, as root)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1000,700", "--disable-background-networking", "--no-first-run"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for errors
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def test_playground_chat_streams_an_answer(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server.url + "/")
    wait = WebDriverWait(browser, 30)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
    box = browser.find_element(By.ID, "message")
    box.send_keys("where does the cat sit")
    browser.find_element(By.ID, "send").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-done='1']"))
    user = browser.find_element(By.CSS_SELECTOR, ".msg.user span").text
    answer = browser.find_element(By.CSS_SELECTOR, ".msg.assistant span").text
    assert user == "where does the cat sit"
    assert answer.strip(), "the streamed answer is empty"
    pieces = browser.find_element(By.CSS_SELECTOR, ".msg.assistant").get_attribute("data-pieces")
    assert int(pieces) > 1, "the answer arrived in one piece, not streamed"
    assert browser.find_element(By.ID, "status").text == ""
    out = Path(SCREENSHOT_DIR or tmp_path) / "playground.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(out)) and out.stat().st_size > 1000


def test_playground_opens_complete_for_a_base_model_and_hides_search(base_server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(base_server.url + "/")
    wait = WebDriverWait(browser, 30)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
    wait.until(lambda d: "active" in d.find_element(By.ID, "tab-complete").get_attribute("class"))
    assert "active" not in browser.find_element(By.ID, "tab-chat").get_attribute("class")
    assert browser.find_element(By.ID, "complete").is_displayed()
    assert not browser.find_element(By.ID, "chat").is_displayed()
    assert not browser.find_element(By.ID, "tab-search").is_displayed()  # no index is served
    option = browser.find_element(By.CSS_SELECTOR, "#model option").text
    assert "default chat template" in option, option
    browser.find_element(By.ID, "prompt").send_keys("the cat")
    browser.find_element(By.ID, "run").click()
    wait.until(lambda d: len(d.find_element(By.ID, "completion").text) > len("the cat"))
    browser.find_element(By.ID, "tab-chat").click()  # chat works too, through the default template
    assert "not instruction-tuned" in browser.find_element(By.ID, "chat-note").text
    browser.find_element(By.ID, "message").send_keys("hello")
    browser.find_element(By.ID, "send").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-done='1']"))
    assert browser.find_element(By.ID, "status").text == ""
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors  # a favicon 404 would be one
