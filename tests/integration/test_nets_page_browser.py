"""The nets page as a browser shows it: a realistic day on PostgreSQL, the status API served
by uvicorn on loopback, and Debian's chromium headless (tests/run.sh installs it where
missing) reading the page and taking a laptop and a phone screenshot.

`FL_UPDATE_SCREENSHOTS=1` copies the screenshots over tests/screenshots/
(app/entrypoints/README.md shows them), reduced to a 256-colour palette so they stay small.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import pytest
import uvicorn
from PIL import Image

from app.entrypoints.api import create_app
from app.runtime import RecordingOutbox, Runtime
from tests.fixtures.day import MISCONFIGURED_ERROR, build_day, day_settings
from tests.fixtures.services import free_port

pytestmark = pytest.mark.integration

SCREENSHOTS = Path(__file__).resolve().parents[1] / "screenshots"
SIZES = {"nets-page-laptop": (1366, 1400), "nets-page-phone": (390, 1800)}


@pytest.fixture
def page_url(tmp_path, job_root, pg_engine, pg_factory, clock) -> Iterator[str]:
    build_day(pg_factory, clock())
    runtime = Runtime(
        settings=day_settings(tmp_path, job_root),
        engine=pg_engine,
        sessions=pg_factory,
        clock=clock,
        outbox=RecordingOutbox(),
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(runtime), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/nets"
    server.should_exit = True
    thread.join(10)


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        "chromium",
        "--headless",
        "--no-sandbox",  # runs as root in CI containers
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)


def visible_text(dom: str) -> str:
    """The page's words as a reader sees them: inline tags (b, a, time) join their
    neighbours, every other tag separates."""
    body = re.sub(r"<style.*?</style>|<head.*?</head>", " ", dom, flags=re.S)
    body = re.sub(r"</?(b|a|time)\b[^>]*>", "", body)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", body)).split())


def test_the_nets_page_in_headless_chromium(page_url, tmp_path):
    profile = tmp_path / "chromium"
    dom = chromium(profile, "--dump-dom", page_url).stdout
    # What the browser parsed from the served page: the day's nets, trouble and jobs.
    text = visible_text(dom)
    assert "fl-dispatcher · nets" in text
    assert "3 nets: 1 BUSY, 1 MISCONFIGURED, 1 READY" in text
    assert "Queue: 2 job(s) (oldest waiting 2h 30m)" in text
    assert f"net-c MISCONFIGURED: {MISCONFIGURED_ERROR}" in text  # needs attention
    assert "net-b 1 stray run(s)" in text
    assert "model-06-train FINISHING since 11:36, attempt 1 of 3" in text
    assert "Cold starts 7 in 24 h, median 50 s (45 s, 1m 01s, 47 s, 55 s, 50 s)" in text
    assert "Cold starts 2 in 24 h, median 1m 18s (1m 15s, 1m 22s)" in text
    assert "net net-c misconfigured" in text  # the requeued job's last error
    assert text.count("model-") >= 14
    assert len(re.findall(r'<i class="k-', dom)) > 40  # the three timelines' segments
    assert "<script" not in dom

    for name, (width, height) in SIZES.items():
        png = tmp_path / f"{name}.png"
        chromium(profile, f"--window-size={width},{height}", f"--screenshot={png}", page_url)
        with Image.open(png) as image:
            assert image.size == (width, height)
            # Not a blank or error page: the page's colours (timeline, badges) are there.
            colours = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
            assert len(colours) > 50
        if os.environ.get("FL_UPDATE_SCREENSHOTS") == "1":
            SCREENSHOTS.mkdir(exist_ok=True)
            with Image.open(png) as image:
                small = image.convert("RGB").quantize(colors=256, dither=Image.Dither.NONE)
                small.save(SCREENSHOTS / png.name, optimize=True)
