#!/usr/bin/env python
"""What tracing costs: the actor and HTTP append benchmarks run twice each,
with tracing off and on, and one table of both.

- off: no tracer provider (what every user without one gets).
- on: ``YOKE_TRACING=otlp`` in the measured process (``yoke serve`` of
  bench/http_api.py; bench/actors.py installs the same provider,
  ``yoke.tracing.install_otlp``): an SDK provider sampling every trace,
  exporting over OTLP/HTTP in batches to a receiver in this process that
  reads and discards the payloads (a collector's cost stays out; the
  export's serialization and POSTs are in).
- sampled 10%: the same with ``OTEL_TRACES_SAMPLER=parentbased_traceidratio``
  and ``OTEL_TRACES_SAMPLER_ARG=0.1``.

The commands are the usual ones: ``bench/actors.py --backend B --routing key
--concurrency 4`` (live events/s, idle append -> process() p50/p99) and
``bench/http_api.py --backend B --tails 0`` (single-event appends from 32
clients, batches of 100). Runs take a few minutes per backend.

    .venv/bin/python bench/tracing.py [--backend sqlite|postgres|all] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).parent


class Discard(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes every export and keeps nothing."""

    received = 0

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        Discard.received += 1
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def last_json(command: list[str], env: dict[str, str]) -> object:
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["all", "postgres", "sqlite"], default="sqlite")
    parser.add_argument("--quick", action="store_true", help="bench/actors.py --quick, 3 s HTTP runs")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Discard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    rows = []
    for backend in backends:
        for mode in ("off", "on", "sampled 10%"):
            env = {**os.environ, "YOKE_TRACING": "off"}
            if mode != "off":
                env.update(YOKE_TRACING="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_SERVICE_NAME="yoke-bench")
            if mode == "sampled 10%":
                env.update(OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0.1")
            actors = last_json([sys.executable, str(HERE / "actors.py"), "--backend", backend, "--routing", "key",
                                "--concurrency", "4", *(["--quick"] if args.quick else [])], env)
            http = last_json([sys.executable, str(HERE / "http_api.py"), "--backend", backend, "--tails", "0",
                              "--seconds", "3" if args.quick else "5"], env)
            a = actors[0]  # type: ignore[index]
            h = http[backend]  # type: ignore[index]
            row = {
                "backend": backend, "tracing": mode, "actors_live_eps": round(a["live_eps"]),
                "actors_p50_ms": round(a["p50_ms"], 2), "actors_p99_ms": round(a["p99_ms"], 2),
                "http_single_eps": round(h["single"]["events_per_s"]), "http_batch_eps": round(h["batch"]["events_per_s"]),
            }
            rows.append(row)
            print(f"{backend} tracing {mode}: actors live {row['actors_live_eps']:,} ev/s, p50 {row['actors_p50_ms']} ms,"
                  f" p99 {row['actors_p99_ms']} ms; HTTP single {row['http_single_eps']:,} ev/s,"
                  f" batches {row['http_batch_eps']:,} ev/s", flush=True)
    print(f"OTLP exports received: {Discard.received}")
    server.shutdown()
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
