"""The console's speed in a real browser: how long each page takes to be
interactive, and how long a live tail takes to show an appended event.

    .venv/bin/python bench/console.py [--runs 10] [--db postgresql://...]

Starts ``yoke serve`` (SQLite in a temporary directory unless ``--db``),
appends 100,000 events to ``/big`` and a few to ``/small``, signs Debian's
chromium in through the printed link, then times each page ``--runs``
times: from the navigation (a full page load, the console's modules
included) until the page has rendered its data (``body[data-ready]``, the
attribute the console sets when a page is done). The tail figure is from
the append request to the row in the page, by the page's clock. Minimum and
median are printed; the target is a page interactive within 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

YOKE = str(Path(sys.executable).with_name("yoke"))
PAGES = {
    "overview": "#/",
    "streams": "#/streams",
    "stream (100,000 events, newest page)": "#/stream?path=/big",
    "stream (100,000 events, offset 50,001)": "#/stream?path=/big&tab=events&after=50000",
    "event": "#/event?path=/big&offset=77777",
    "tokens": "#/tokens",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, token: str, body: object) -> None:
    request = urllib.request.Request(
        url, method="POST", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    urllib.request.urlopen(request, timeout=60).read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--db", default=None, help="a database URL (default: SQLite in a temporary directory)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        env = {**os.environ, "YOKE_ACCESS_LOG": "0", **({"YOKE_DATABASE_URL": args.db} if args.db else {})}
        log = Path(tmp) / "server.log"
        process = subprocess.Popen([YOKE, "serve", "--port", str(port)], cwd=tmp, env=env,
                                   stdout=log.open("w"), stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while not re.search(r"console:\s+(\S+)", log.read_text()):
                assert time.monotonic() < deadline and process.poll() is None, log.read_text()
                time.sleep(0.1)
            link = re.search(r"console:\s+(\S+)", log.read_text()).group(1)
            token = (Path(tmp) / ".yoke" / f"token-{port}").read_text().strip()
            batch = [{"type": "tick", "payload": {"i": i, "text": "x" * 40}} for i in range(1000)]
            for _ in range(100):
                post(f"{url}/v1/streams/big/-/events", token, batch)
            post(f"{url}/v1/streams/small/-/events", token, batch[:3])
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(link)
                page.wait_for_selector('body[data-ready="overview"]')
                print(f"{'page':42} {'min':>8} {'median':>8}   (s, {args.runs} full loads each)")
                for name, route in PAGES.items():
                    times = []
                    ready = route.lstrip("#/").split("?")[0] or "overview"
                    for _ in range(args.runs):
                        page.goto("about:blank")
                        started = time.perf_counter()
                        page.goto(f"{url}/ui/{route}")
                        page.wait_for_selector(f'body[data-ready="{ready}"]')
                        times.append(time.perf_counter() - started)
                    print(f"{name:42} {min(times):8.3f} {statistics.median(times):8.3f}")
                page.goto(f"{url}/ui/#/stream?path=/small&tab=tail")
                page.wait_for_selector("#tail-state:text('live')")
                page.evaluate("""() => { window.seen = {}; new MutationObserver(() => {
                    for (const row of document.querySelectorAll('#tail tbody tr')) window.seen[row.dataset.offset] ??= Date.now();
                }).observe(document.querySelector('#tail tbody'), { childList: true }); }""")
                latencies = []
                for n in range(args.runs):
                    before = page.evaluate("Date.now()")
                    post(f"{url}/v1/streams/small/-/events", token, {"type": "tick", "payload": {"n": n}})
                    offset = 4 + n
                    page.wait_for_selector(f'#tail tbody tr[data-offset="{offset}"]')
                    latencies.append((page.evaluate(f"window.seen[{offset}]") - before) / 1000)
                print(f"{'live tail: append to row shown':42} {min(latencies):8.3f} {statistics.median(latencies):8.3f}")
                browser.close()
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
