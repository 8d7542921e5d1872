"""The live page (/ui) and its data (GET /admin/live) on a real `gateway serve` under load, in headless Chromium.

Chromium is Debian's (apt-get install chromium chromium-driver), driven by selenium through
/usr/bin/chromedriver. Without it the browser test is skipped with the reason printed, except in
CI (CI=true) or with GATEWAY_REQUIRE_CHROMIUM=1 (set by .ci/run), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.helpers import ROOT, Gateway, run_gateway

TOKEN = "live-page-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROFILE = ROOT / "tests" / "data" / "emulated_gpu.csv"
INPUTS = {"mlp": [1, 512], "cnn_small": [1, 3, 32, 32]}
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# No network here: Chromium must not try to reach Google's services (updates, sync, QUIC probes).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, example_models) -> Iterator[Gateway]:
    """mlp and cnn_small on CPU executors under the feed-forward controller, beside an emulated GPU."""
    folder = tmp_path_factory.mktemp("live")
    for name in INPUTS:
        shutil.copy(example_models / f"{name}.onnx", folder / f"{name}.onnx")
    (folder / "config.toml").write_text(
        f'[server]\nadmin_token = "{TOKEN}"\n\n[node]\ncpu_cores = 1.5\ngpus = [0]\n\n'
        '[control]\npolicy = "feedforward"\n\n'
        f'[gpu]\nexecutor = "emulated"\nprofile = "{PROFILE}"\n\n'
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 40\nmax_batch_size = 8\ncpu = { cores = 0.5, threads = 1 }\n\n'
        '[models.cnn_small]\npath = "cnn_small.onnx"\nsla_ms = 100\nmax_batch_size = 8\ncpu = { cores = 0.5, threads = 1 }\n'
    )
    with run_gateway(folder / "config.toml") as running:
        yield running


def _body(model: str, rng: np.random.Generator) -> dict:
    shape = INPUTS[model]
    data = rng.standard_normal(shape).astype(np.float32).ravel().tolist()
    return {"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": data}]}


class Load:
    """Closed-loop load on every model from a few threads until stopped; counts what succeeded."""

    def __init__(self, base: str, threads: int = 4):
        self.base, self.ok, self.sent = base, 0, 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        bodies = {model: _body(model, rng) for model in INPUTS}
        with requests.Session() as session:
            while not self._stop.is_set():
                for model, body in bodies.items():
                    status = session.post(f"{self.base}/v2/models/{model}/infer", json=body, timeout=30).status_code
                    with self._lock:
                        self.sent += 1
                        self.ok += status == 200
                time.sleep(0.01)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def test_live_data_is_the_admin_apis_and_counts_the_requests(gateway):
    live = f"{gateway.base}/admin/live"
    missing = requests.get(live, timeout=10)
    assert missing.status_code == 401 and "bearer token" in missing.json()["error"]
    for bad in ("0", "601", "abc", "-5", "1.5", "٣"):
        response = requests.get(live, params={"seconds": bad}, headers=AUTH, timeout=10)
        assert response.status_code == 400, bad
        assert "'seconds'" in response.json()["error"]
    unknown = requests.get(live, params={"second": "5"}, headers=AUTH, timeout=10)
    assert unknown.status_code == 400 and "'second'" in unknown.json()["error"]

    rng = np.random.default_rng(0)
    before = requests.get(live, params={"seconds": 600}, headers=AUTH, timeout=10).json()
    counted_before = sum(sum(m["series"]["requests"]) for m in before["models"])
    for _ in range(20):
        assert requests.post(f"{gateway.base}/v2/models/mlp/infer", json=_body("mlp", rng), timeout=10).status_code == 200
    time.sleep(1.1)  # the series hold whole seconds: let the last one close
    doc = requests.get(live, params={"seconds": 600}, headers=AUTH, timeout=10).json()
    assert doc["seconds"] == len(doc["t"]) == 600 and doc["t"][-1] == -1
    assert doc["node"]["cpu_cores"] == 1.5 and doc["node"]["controlled"] is True
    models = {m["name"]: m for m in doc["models"]}
    assert set(models) == set(INPUTS)
    mlp = models["mlp"]
    assert all(len(values) == 600 for values in mlp["series"].values())
    assert sum(sum(m["series"]["requests"]) for m in doc["models"]) - counted_before == 20
    assert mlp["series"]["sla_ms"][-1] == 40
    assert any(v is not None and v > 0 for v in mlp["series"]["mean_rt_ms"])
    assert sum(int(n) * count for n, count in mlp["batch_sizes"].items()) >= 20  # every row ran in some batch
    # Each control period closed leaves each model's demanded and granted cores (one a second).
    deadline = time.monotonic() + 10
    while not any(v is not None for v in mlp["series"]["granted_cores"]):
        assert time.monotonic() < deadline, "no control period in the series"
        time.sleep(0.5)
        doc = requests.get(live, params={"seconds": 600}, headers=AUTH, timeout=10).json()
        mlp = {m["name"]: m for m in doc["models"]}["mlp"]
    assert any(v is not None for v in mlp["series"]["demanded_cores"])
    assert any(v is not None for v in doc["node"]["granted_cores"])
    assert [g["id"] for g in doc["gpus"]] == ["gpu-0"] and len(doc["gpus"][0]["busy"]) == 600
    assert set(doc["scaling"]) >= {"gpus", "bad_rate", "idle_fraction", "gpus_to_add", "gpus_to_release"}


def test_the_page_and_its_files_are_served_without_a_token(gateway):
    page = requests.get(f"{gateway.base}/ui", timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "/ui/uPlot.iife.min.js" in page.text and "/admin/live" in page.text
    for name, media_type in {"live.js": "text/javascript", "uPlot.min.css": "text/css", "uPlot.LICENSE": "text/plain"}.items():
        response = requests.get(f"{gateway.base}/ui/{name}", timeout=10)
        assert response.status_code == 200 and response.headers["Content-Type"].startswith(media_type), name
    assert "MIT" in requests.get(f"{gateway.base}/ui/uPlot.LICENSE", timeout=10).text
    assert requests.get(f"{gateway.base}/ui/../config.toml", timeout=10).status_code == 404


def _chromium():
    """A headless Chromium under selenium, or the reason there is none."""
    required = os.environ.get("CI") == "true" or os.environ.get("GATEWAY_REQUIRE_CHROMIUM") == "1"
    reason = None
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        reason = "no Chromium: apt-get install -y chromium chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver)"
    else:
        try:
            import selenium  # noqa: F401
        except ImportError:
            reason = "no selenium: pip install -e '.[test]'"
    if reason is not None:
        if required:
            pytest.fail(f"{reason} (required here: CI=true or GATEWAY_REQUIRE_CHROMIUM=1)")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    return options, Service(str(CHROMEDRIVER)), webdriver


def test_the_page_draws_every_model_and_changes_an_sla(gateway, tmp_path):
    options, service, webdriver = _chromium()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.add_argument("--window-size=1400,1000")
    driver = webdriver.Chrome(options=options, service=service)
    try:
        wait = WebDriverWait(driver, 20, poll_frequency=0.2)
        with Load(gateway.base) as load:
            driver.get(f"{gateway.base}/ui")
            # Without the token the page says what is missing, and draws nothing.
            wait.until(lambda d: "needs its token" in d.find_element(By.ID, "status").text)
            driver.find_element(By.ID, "token").send_keys(TOKEN)

            def drawn(d) -> bool:
                cards = d.find_elements(By.CSS_SELECTOR, "section.model[data-drawn]")
                values = [c.find_element(By.CSS_SELECTOR, ".rt-mean").get_attribute("data-value") for c in cards]
                draws = int(d.find_element(By.TAG_NAME, "body").get_attribute("data-draws") or 0)
                return len(cards) == len(INPUTS) and all(values) and draws >= 3

            wait.until(drawn)
            # Seconds with load in them on every model's chart, beside its SLA line.
            wait.until(lambda d: all(d.execute_script(_SERVED_SECONDS, name) >= 2 for name in INPUTS))
            for name, sla in (("mlp", 40), ("cnn_small", 100)):
                card = driver.find_element(By.CSS_SELECTOR, f'section.model[data-model="{name}"]')
                assert float(card.find_element(By.CSS_SELECTOR, ".rt-mean").get_attribute("data-value")) > 0
                assert card.find_element(By.CSS_SELECTOR, ".sla").get_attribute("data-value") == str(sla)
                assert card.find_elements(By.CSS_SELECTOR, ".chart-rt canvas"), "the response-time chart has no canvas"
                labels = driver.execute_script(_SERIES_LABELS, name)
                assert labels == ["s", "mean", "p99", "SLA"], labels
                assert driver.execute_script(_SLA_LINE, name) == sla

            # An operator sets mlp's SLA from the page; the admin API and the chart's SLA line follow.
            form = driver.find_element(By.CSS_SELECTOR, 'section.model[data-model="mlp"] .sla-form')
            field = form.find_element(By.NAME, "sla_ms")
            field.clear()
            field.send_keys("250")
            form.find_element(By.TAG_NAME, "button").click()
            wait.until(lambda d: "SLA set to 250 ms" in form.find_element(By.CLASS_NAME, "sla-result").text)
            state = requests.get(f"{gateway.base}/admin/models/mlp", headers=AUTH, timeout=10).json()
            assert state["sla_ms"] == 250
            wait.until(lambda d: d.execute_script(_SLA_LINE, "mlp") == 250)
            driver.set_window_size(1400, driver.execute_script("return document.documentElement.scrollHeight") + 160)
            time.sleep(1.2)  # one more refresh at the full size
            screenshot = tmp_path / "ui.png"
            assert driver.save_screenshot(str(screenshot))
        assert load.ok >= 200, f"only {load.ok} of {load.sent} requests succeeded"
        if os.environ.get("GATEWAY_UI_SCREENSHOT"):
            shutil.copy(screenshot, os.environ["GATEWAY_UI_SCREENSHOT"])
    finally:
        driver.quit()
    assert screenshot.stat().st_size > 10_000


# What the page's charts hold (gateway/ui/static/live.js keeps them in window.gatewayLive).
_SERVED_SECONDS = "return gatewayLive.modelCharts.get(arguments[0]).load.data[1].filter(v => v > 0).length"
_SERIES_LABELS = "return gatewayLive.modelCharts.get(arguments[0]).rt.series.map(s => s.label)"
_SLA_LINE = "const d = gatewayLive.modelCharts.get(arguments[0]).rt.data[3]; return d[d.length - 1]"
_NODE_CORES = "return gatewayLive.charts.node.cores.data[3].filter(v => v > 0).length"


def test_models_named_as_the_node_and_the_gpus_are_drawn_beside_them(tmp_path, example_models):
    """The page kept the node's and the GPUs' charts in the object of the models' charts: a model
    named "gpus" replaced the GPUs' charts and every refresh threw a TypeError (no card drawn),
    and one named "node" replaced the node's cores chart with its own."""
    for name in ("node", "gpus"):
        shutil.copy(example_models / "mlp.onnx", tmp_path / f"{name}.onnx")
    (tmp_path / "config.toml").write_text(
        f'[node]\ncpu_cores = 1.0\ngpus = [0]\n\n[gpu]\nexecutor = "emulated"\nprofile = "{PROFILE}"\n\n'
        '[models.node]\npath = "node.onnx"\nsla_ms = 100\ngpu_profile = "mlp"\n\n'
        '[models.gpus]\npath = "gpus.onnx"\nsla_ms = 100\ngpu_profile = "mlp"\n'
    )
    options, service, webdriver = _chromium()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    with run_gateway(tmp_path / "config.toml") as running:
        driver = webdriver.Chrome(options=options, service=service)
        try:
            driver.get(f"{running.base}/ui")

            def drawn(d) -> bool:
                cards = d.find_elements(By.CSS_SELECTOR, "section.model[data-drawn]")
                return len(cards) == 2 and int(d.find_element(By.TAG_NAME, "body").get_attribute("data-draws") or 0) >= 3

            WebDriverWait(driver, 20, poll_frequency=0.2).until(drawn)
            assert "unreachable" not in driver.find_element(By.ID, "status").text
            assert driver.execute_script(_NODE_CORES) >= 1  # the node's own line: its cores, 1.0
            for name in ("node", "gpus"):
                assert driver.execute_script(_SERIES_LABELS, name) == ["s", "mean", "p99", "SLA"]
        finally:
            driver.quit()
