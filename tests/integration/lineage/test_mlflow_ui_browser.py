"""The MLflow UI, in a real headless Chromium, shows the pipeline run, its stage
children and the handoff tags of the RL run."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from lineage.mlflow_server import server_command

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
CHROME_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--disable-quic", "--disable-sync",
                "--window-size=1600,1200")
WAIT_S = 60

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_ui(four_stage_run, tmp_path_factory):
    run_dir, _, _ = four_stage_run
    port = _free_port()
    log = tmp_path_factory.mktemp("ui") / "mlflow-server.log"
    with open(log, "w") as out:
        # Own process group: `mlflow server` forks uvicorn, and teardown kills them all.
        server = subprocess.Popen(
            server_command(f"sqlite:///{run_dir / 'mlflow.db'}", str(run_dir / "mlartifacts"), port),
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not come up on port {port}:\n{log.read_text()}")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=15)


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip(f"needs {CHROMIUM} and {CHROMEDRIVER}")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chrome-profile'}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_ui_shows_the_pipeline_its_stages_and_the_rl_handoff_tags(
        mlflow_ui, browser, four_stage_run, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait
    _, mlf, ids = four_stage_run
    wait = WebDriverWait(browser, WAIT_S)
    try:
        browser.get(f"{mlflow_ui}/#/experiments/{mlf.experiment_id()}/runs")
        parent = wait.until(ec.element_to_be_clickable((By.LINK_TEXT, "baton #1")))
        # Child runs are folded under their parent; the row's only button unfolds them.
        parent.find_element(By.XPATH, "./ancestor::*[@role='row'][1]//button").click()
        for stage in ("cpt", "sft", "rm"):
            wait.until(ec.presence_of_element_located((By.LINK_TEXT, f"{stage} attempt 1")))
        # The SFT run's datasets (stages.data) in the runs table's Dataset column: name, our
        # content digest, and the context tag.
        wait.until(ec.text_to_be_present_in_element((By.TAG_NAME, "body"), "sft-train: chats.parquet"))
        table = browser.find_element(By.TAG_NAME, "body").text
        assert "a1a1a1a1" in table.split("sft-train: chats.parquet", 1)[1][:60], table[-2000:]
        wait.until(ec.element_to_be_clickable((By.LINK_TEXT, "rl attempt 1"))).click()
        # The run page fills in its sections (tags, parent name) from separate requests.
        for text in ("baton.handoff.criterion", "entropy_floor", "Parent run", "baton #1"):
            wait.until(ec.text_to_be_present_in_element((By.TAG_NAME, "body"), text))
        body = browser.find_element(By.TAG_NAME, "body").text
        assert ids["mlflow_runs"]["rl"] in browser.current_url
        for tag, value in [("baton.handoff.criterion", "entropy_floor"),
                           ("baton.handoff.chosen_step", "20"),
                           ("baton.handoff.entropy", "1.3100"),
                           ("baton.handoff.from_stage", "sft")]:
            assert tag in body and value in body.split(tag, 1)[1][:40], (tag, value)
        assert "Parent run" in body and "baton #1" in body
    finally:
        browser.save_screenshot(str(tmp_path / "mlflow-rl-run.png"))
    assert (tmp_path / "mlflow-rl-run.png").stat().st_size > 10_000
