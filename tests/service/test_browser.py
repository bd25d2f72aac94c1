"""The web page in a real headless Chromium: sign in, submit a small sim study, watch it finish.

Drives Debian's ``chromium`` with Playwright's Python package (``executable_path``: no browser
download). Starts a real ``autoslapo serve --workers 1`` on a free loopback port. The screenshot
goes under the test's tmp directory (and, with AUTOSLAPO_SCREENSHOT=1, to
experiments/results/service_screenshot.png, the README's copy).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from autoslapo.service import create_token
from store import open_store
from tests.service.test_processes import ROOT, free_port

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = ROOT / "experiments" / "results" / "service_screenshot.png"
SKIP = "needs Debian's chromium at /usr/bin/chromium: apt-get install -y chromium"

sync_api = pytest.importorskip("playwright.sync_api", reason="needs Playwright's Python package: pip install playwright")
if not CHROMIUM.exists():
    pytest.skip(SKIP, allow_module_level=True)


class Server:
    """``autoslapo serve --workers 1`` on a fresh SQLite file, stopped (with its worker) at the end."""

    def __init__(self, tmp: Path) -> None:
        self.url = f"sqlite:///{tmp / 'browser.db'}"
        self.base = f"http://127.0.0.1:{free_port()}"
        with open_store(self.url) as store:
            self.submit = create_token(store, "browser", "submit")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOSLAPO_STORAGE": self.url}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "autoslapo", "serve", "--port", self.base.rsplit(":", 1)[1], "--workers", "1"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.close()
        raise AssertionError("autoslapo serve did not answer /healthz within 60 s")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # the server stops its worker on the way out
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    yield s
    s.close()


@pytest.mark.slow  # an end-to-end run of separate processes (see pyproject's markers)
def test_sign_in_submit_a_study_and_watch_it_finish_in_chromium(server: Server, tmp_path: Path) -> None:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(f"{server.base}/")
            page.fill("input[name=token]", server.submit)
            page.click("text=Sign in")
            page.wait_for_selector("table#studies")
            page.select_option("#submit select[name=model]", "bert-large")
            page.fill("#submit input[name=gpus]", "8")
            page.select_option("#submit select[name=gpu_type]", "a100-80gb")
            page.select_option("#submit select[name=backend]", "sim")
            page.fill("#submit input[name=trials]", "5")
            page.fill("#submit input[name=name]", "browser-svc")
            page.fill("#submit input[name=inter_node_gbps]", "6.25")  # the cluster's own network
            page.click("#submit button")
            page.wait_for_url(f"{server.base}/studies/browser-svc", timeout=30_000)
            page.wait_for_function("document.getElementById('status') && "
                                   "document.getElementById('status').textContent === 'complete'",
                                   timeout=240_000, polling=500)
            assert "5/5" in page.inner_text("#progress")
            assert "autoslapo.apply_best(\"bert-large\", gpus=8" in page.inner_text("#snippet")
            # the chart has a point per launched trial and the best-so-far line; the report is framed
            assert page.locator("#chart circle").count() == 5
            assert page.locator("#chart polyline.best").count() == 1
            page.wait_for_selector("iframe#report")
            page.click("#copy")
            assert page.inner_text("#copy") == "Copied"
            page.goto(f"{server.base}/")
            page.wait_for_selector("table#studies")
            assert "browser-svc" in page.inner_text("table#studies")
            with open_store(server.url) as store:
                assert store.get_study("browser-svc").cluster["inter_node_gbps"] == 6.25
            page.goto(f"{server.base}/studies/browser-svc")
            shot = tmp_path / "service_screenshot.png"
            page.screenshot(path=str(shot), full_page=False)
            assert shot.stat().st_size > 10_000
            if os.environ.get("AUTOSLAPO_SCREENSHOT"):  # refresh the README's copy on request only
                SCREENSHOT.write_bytes(shot.read_bytes())
        finally:
            browser.close()
