"""Playwright end-to-end harness: the REAL server (embedded model, no mocks) as a
subprocess, Debian's Chromium driven by the sync API, and a static copy of the site
with no backend for the replay scenario.

Fixtures:
    live_server   base URL of `kvscope serve` (one per session)
    browser       one Chromium for the session
    page          a fresh page; `page.kv_problems` lists console errors, page errors,
                  failed requests and HTTP errors seen so far; new_page(**context options)
    screenshot    screenshot(page_or_locator, name) → path under test-artifacts/screenshots/
    assert_clean  assert_clean(page); wait_for_widgets(page) → tags, once each has painted
    recordings    folder of recordings: the committed ones, or one recorded from live_server
    static_site   base URL of the exported pages on a plain file server (no /ws)
    own_server    own_server(workdir, env) → (url, stop): a server of the test's own
    instructor    send(command dict) → replies, over an instructor WebSocket
"""
from __future__ import annotations

import contextlib

import asyncio
import functools
import http.server
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "test-artifacts"
SCREENSHOTS = ARTIFACTS / "screenshots"
INSTRUCTOR_TOKEN = "e2e-instructor-token"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SERVER_START_TIMEOUT_S = 120
WIDGET_TAGS = tuple(sorted(path.stem for path in (REPO / "frontend" / "js" / "widgets").glob("kv-*.js")))


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.e2e)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, log_path: Path, name: str, timeout_s: float,
                  poll_s: float) -> None:
    """Until GET `url` answers 200. Raises, with the end of the server's log, if the process
    exits first or timeout_s passes (until it is up the port refuses: poll every poll_s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(poll_s)
    raise RuntimeError(f"{name} did not answer {url} in {timeout_s} s:\n{log_path.read_text()[-3000:]}")


def _wait_for_health(url: str, process: subprocess.Popen, log_path: Path) -> None:
    wait_until_up(url + "/healthz", process, log_path, "the server", SERVER_START_TIMEOUT_S, poll_s=0.3)


def skip_or_fail(reason: str) -> None:
    """Under CI a browser test that cannot start fails: a green run with the e2e tests
    skipped would prove nothing. Elsewhere it is skipped with the reason."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if not CHROMIUM.exists():
        skip_or_fail("browser tests need Debian's Chromium at /usr/bin/chromium (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        skip_or_fail("browser tests need the playwright Python package (pip install playwright)")
    return str(CHROMIUM)


def start_server(workdir: Path, extra_env: dict | None = None, extra_args: tuple[str, ...] = (),
                 compile_decode: bool = False) -> tuple[str, subprocess.Popen]:
    """`kvscope serve` on a free port with the embedded model; returns (url, process).
    Decode runs eagerly unless `compile_decode` (compiling costs 10-20 s per server)."""
    for module in ("kvscope.server.main", "kvscope.server.pages.routes", "fastapi", "uvicorn"):
        if importlib.util.find_spec(module) is None:
            skip_or_fail(f"the live server cannot start: {module} is not importable yet")
    port = free_port()
    log_path = workdir / "server.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(extra_env or {}),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "backend"), os.environ.get("PYTHONPATH")]))}
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "kvscope.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--instructor-token", INSTRUCTOR_TOKEN, "--recordings-dir", str(workdir / "recordings"),
             "--log-level", "warning", "--cpu-compile" if compile_decode else "--no-cpu-compile", *extra_args],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_health(url, process, log_path)
    except BaseException:
        stop_server(process)
        raise
    return url, process


def stop_server(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)   # uvicorn shuts down cleanly on SIGINT
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@pytest.fixture
def own_server(chromium_path):
    """own_server(workdir, env, args) → (url, stop): a server for one test (with extra
    `kvscope serve` arguments if given), stopped at its end if the test has not stopped it."""
    processes = []

    def start(workdir: Path, extra_env: dict | None = None, extra_args: tuple[str, ...] = ()):
        url, process = start_server(workdir, extra_env, extra_args)
        processes.append(process)
        return url, lambda: stop_server(process)

    yield start
    for process in processes:
        stop_server(process)


@pytest.fixture(scope="session")
def instructor_token() -> str:
    return INSTRUCTOR_TOKEN


@pytest.fixture(scope="session")
def live_server(chromium_path, tmp_path_factory):
    # the session's shared server runs as `kvscope serve` does by default: decode compiled
    url, process = start_server(tmp_path_factory.mktemp("server"), compile_decode=True)
    try:
        yield url
    finally:
        stop_server(process)


@pytest.fixture(scope="session")
def browser(chromium_path):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _watch(page) -> None:
    problems: list[str] = []
    page.kv_problems = problems
    page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    tab = context.new_page()
    _watch(tab)
    yield tab
    context.close()


@pytest.fixture
def new_page(browser):
    """Factory for pages with other viewport/colour-scheme/motion settings."""
    contexts = []

    def make(**options):
        options.setdefault("viewport", {"width": 1280, "height": 900})
        context = browser.new_context(**options)
        contexts.append(context)
        tab = context.new_page()
        _watch(tab)
        return tab

    yield make
    for context in contexts:
        context.close()


def _assert_clean(page) -> None:
    assert not page.kv_problems, "problems on " + page.url + ":\n  " + "\n  ".join(page.kv_problems)


@pytest.fixture
def assert_clean():
    """assert_clean(page): no console error, page error, failed request or HTTP error so far."""
    return _assert_clean


@pytest.fixture
def screenshot(request):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(page_or_locator, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page_or_locator.screenshot(path=str(path))
        return path

    return take


def _wait_for_widgets(page, timeout_ms: int = 15000) -> list[str]:
    """Waits until every widget on the page has painted; returns their tags."""
    tags = page.evaluate(f"() => {json.dumps(list(WIDGET_TAGS))}.filter(t => document.querySelector(t))")
    for tag in tags:
        page.wait_for_selector(f"{tag}[data-painted]", state="attached", timeout=timeout_ms)
    return tags


@pytest.fixture
def wait_for_widgets():
    """wait_for_widgets(page) → the widget tags on the page, once each has painted."""
    return _wait_for_widgets


# -- instructor commands (recording, synthetic load) -----------------------------------

async def _instructor_session(url: str, commands: list[dict], until: str | None, timeout: float) -> list[dict]:
    import websockets
    events: list[dict] = []
    ws_url = url.replace("http://", "ws://") + f"/ws?token={INSTRUCTOR_TOKEN}"
    async with websockets.connect(ws_url, max_size=None) as ws:
        for n, command in enumerate(commands):
            await ws.send(json.dumps({"ref": f"t{n}", **command}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                frame = await asyncio.wait_for(ws.recv(), timeout=max(0.05, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
            batch = json.loads(frame)
            for event in batch if isinstance(batch, list) else [batch]:
                events.append(event)
                if until and event.get("type") == "ack" and event.get("cmd") == until:
                    return events
    return events


@pytest.fixture(scope="session")
def instructor(live_server):
    def send(*commands: dict, until: str | None = None, timeout: float = 30.0) -> list[dict]:
        # Its own thread: Playwright's sync API already runs an event loop in this one.
        result: list = []
        thread = threading.Thread(target=lambda: result.append(
            asyncio.run(_instructor_session(live_server, list(commands), until, timeout))))
        thread.start()
        thread.join(timeout + 10)
        return result[0] if result else []
    return send


def _record_default(live_server: str, instructor, folder: Path) -> None:
    """A small recording made now from the live server, for when none is committed."""
    instructor({"type": "record_start", "name": "default"}, until="record_start")
    instructor({"type": "inject", "n": 3, "max_tokens": 24, "prompt_tokens": 20}, until="inject")
    time.sleep(6)
    events = instructor({"type": "record_stop"}, until="record_stop")
    ack = next(e for e in events if e.get("type") == "ack" and e.get("cmd") == "record_stop")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(ack["path"], folder / "default.jsonl")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        """No per-request log lines in the test output."""


@pytest.fixture(scope="session")
def recordings(tmp_path_factory, request) -> Path:
    """A folder of recordings: the committed ones, or one recorded now from live_server."""
    from kvscope.server.pages import Site
    committed = Site().recordings
    if list(committed.glob("*.jsonl")):
        return committed
    folder = tmp_path_factory.mktemp("recordings")
    _record_default(request.getfixturevalue("live_server"), request.getfixturevalue("instructor"), folder)
    return folder


@pytest.fixture(scope="session")
def static_site(chromium_path, tmp_path_factory, recordings):
    """The pages exported as files and served by http.server: no engine, no /ws."""
    from kvscope.server.pages import Site, export_static_site
    out = tmp_path_factory.mktemp("static-site")
    export_static_site(out, Site(recordings=recordings))
    handler = functools.partial(_QuietHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
