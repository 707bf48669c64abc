"""`yoke backup` of a running SQLite server under load: how long it takes,
how long the server's writes wait, and its size, for N instances; with
--pg URL (an empty database, as a superuser), `pg_dump -Fc` of a running
PostgreSQL server instead.

    .venv/bin/python bench/backup.py --instances 600
    .venv/bin/python bench/backup.py --instances 600 --pg postgresql://postgres@127.0.0.1/yoke_bench

Starts `yoke serve --app tests.production.backup_app:app` (atomic counters,
one instance per key) in a temporary directory, appends ticks over HTTP
until every instance has its database, then backs up while the appends go on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instances", type=int, default=600)
    parser.add_argument("--pg", default="", help="an empty PostgreSQL database (superuser URL): pg_dump it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        db_url = args.pg or f"sqlite:///{base}/yoke.db"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "YOKE_DATABASE_URL": db_url,
               "YOKE_DATA_DIR": str(base / ".yoke"), "YOKE_PORT": "0", "YOKE_ACCESS_LOG": "0"}
        server = subprocess.Popen([sys.executable, "-m", "yoke.cli", "serve", "--json", "--app",
                                   "tests.production.backup_app:app"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        try:
            url = json.loads(server.stdout.readline())["url"]
            token = next((base / ".yoke").glob("token-*")).read_text().strip()
            http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
            stop = threading.Event()
            sent = [0]

            def load() -> None:
                with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
                    while not stop.is_set():
                        i = sent[0]
                        c.post("/v1/streams/ticks/-/events",
                               json={"type": "tick", "payload": {"k": i % args.instances, "i": i}})
                        sent[0] += 1

            loader = threading.Thread(target=load)
            loader.start()
            while len(http.get("/v1/instances", params={"actor": "counter", "limit": 1000}).json()["instances"]) \
                    < args.instances:
                time.sleep(0.2)
            rate_before = sent[0]
            time.sleep(2)
            rate = (sent[0] - rate_before) / 2
            if args.pg:
                started = time.monotonic()
                subprocess.run(["pg_dump", "-Fc", "-f", str(base / "yoke.dump"), args.pg], check=True)
                result = {"took_s": round(time.monotonic() - started, 3), "bytes": (base / "yoke.dump").stat().st_size}
            else:
                done = subprocess.run([sys.executable, "-m", "yoke.cli", "backup", str(base / "backup"), "--json"],
                                      env=env, capture_output=True, text=True, check=True)
                result = json.loads(done.stdout)
            stop.set()
            loader.join()
            events = http.get("/v1/streams/ticks").json().get("head")
            http.close()
            print(json.dumps({**result, "keys": args.instances, "ticks": events,
                              "load_appends_per_s": rate}, indent=2))
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
