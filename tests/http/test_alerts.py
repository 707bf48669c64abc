"""docs/production/alerts.yml and dashboard.json name only metrics and labels
that real Yoke processes produce.

promtool is not available here, so this is not a PromQL validator: a small
tokenizer finds each expression's selectors (metric name and label matchers)
and its grouping labels (by, without, on, ignoring), and checks them against
real scrapes of `yoke serve --no-executor` and `yoke worker --metrics-port`
on PostgreSQL, driven into the states the rules watch (a fan-out lag, a dead
letter, a delivering subscription, a refused connection):

- every metric name appears in a scrape (a series or its # TYPE line;
  histograms with _bucket), except Prometheus's own `up`, and except
  yoke_worker_reaps_total / yoke_worker_rejoins_total, which another branch
  adds (they are checked once a scrape has them);
- every matcher's label is a label of that metric's series in a scrape;
- an equality matcher's value is seen in a scrape, or is listed for that
  metric in docs/production/metrics.md (values that need a rare state: a
  full connection cap, a pending row);
- every grouping label is a label of a selector of the same expression, or
  a label Prometheus adds (instance, job) or a histogram's le.
"""

from __future__ import annotations

import json
import re
import socket
from collections import defaultdict
from pathlib import Path

import httpx
import yaml

from .conftest import ROOT, free_port, own_database, start_server, stop_server
from .test_actors_api import Tenant
from .test_metrics_ops import APP, FAST, start_worker, stop_worker, value, wait_for

PRODUCTION = ROOT / "docs" / "production"
PROMETHEUS_OWN = {"up"}
TARGET_LABELS = {"instance", "job"}
ELSEWHERE = {"yoke_worker_reaps_total", "yoke_worker_rejoins_total"}  # the membership branch adds them
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"and", "or", "unless", "bool", "offset"}
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|\[[^\]]*\]|[A-Za-z_:][A-Za-z0-9_:]*|=~|!~|!=|==|>=|<=|\S')


def parse(expr: str) -> tuple[list[tuple[str, list[tuple[str, str, str]]]], set[str]]:
    """The selectors (name, [(label, op, value)]) and grouping labels of a PromQL expression."""
    tokens = TOKEN.findall(expr)
    selectors, grouping = [], set()
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if tok in GROUPING and nxt == "(":
            j = tokens.index(")", i)
            grouping |= {t for t in tokens[i + 2:j] if t != ","}
            i = j + 1
            continue
        # A name followed by "(" or by a grouping is a function or an aggregation.
        if re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tok) and nxt != "(" and nxt not in GROUPING \
                and tok not in KEYWORDS:
            matchers = []
            if nxt == "{":
                j = tokens.index("}", i)
                body = [t for t in tokens[i + 2:j] if t != ","]
                matchers = [(body[k], body[k + 1], body[k + 2][1:-1]) for k in range(0, len(body), 3)]
                i = j
            selectors.append((tok, matchers))
        i += 1
    return selectors, grouping


def test_the_parser_reads_selectors_and_grouping() -> None:
    selectors, grouping = parse(
        'sum by (tenant, kind) (max without (instance, job) (yoke_failures{kind="dead_letter", age!="x"}))'
        ' > 0 or time() - yoke_x_total[5m] >= ignoring(state) y{state=~"a|b"}'
    )
    assert selectors == [
        ("yoke_failures", [("kind", "=", "dead_letter"), ("age", "!=", "x")]), ("yoke_x_total", []),
        ("y", [("state", "=~", "a|b")]),
    ]
    assert grouping == {"tenant", "kind", "instance", "job", "state"}


def expressions() -> list[tuple[str, str]]:
    rules = yaml.safe_load((PRODUCTION / "alerts.yml").read_text())
    found = [(f"alert {r['alert']}", r["expr"]) for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((PRODUCTION / "dashboard.json").read_text())
    found += [(f"panel {p['title']}", t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    return found


class Scrapes:
    """What the scrapes hold: metric names, and per metric its label names and values."""

    def __init__(self, texts: list[str]) -> None:
        self.names: set[str] = set()
        self.labels: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for text in texts:
            for line in text.splitlines():
                if line.startswith("# TYPE "):
                    _, _, name, kind = line.split(" ", 3)
                    self.names.add(name)
                    if kind == "histogram":
                        self.names |= {name + "_bucket", name + "_sum", name + "_count"}
                    continue
                if not line or line.startswith("#"):
                    continue
                name, _, rest = line.partition("{")
                name = name.split(" ")[0]
                self.names.add(name)
                for label, val in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', rest.rsplit("}", 1)[0]):
                    self.labels[name][label].add(val)


def documented(metric: str, val: str) -> bool:
    """Whether docs/production/metrics.md's row for ``metric`` names ``val``."""
    for line in (PRODUCTION / "metrics.md").read_text().splitlines():
        if line.startswith(f"| `{metric}") and f"`{val}`" in line:
            return True
    return False


def problems(scrapes: Scrapes) -> list[str]:
    found = []
    for where, expr in expressions():
        selectors, grouping = parse(expr)
        known_labels = set(TARGET_LABELS) | {"le"}
        for name, matchers in selectors:
            if name in PROMETHEUS_OWN:
                known_labels |= {m[0] for m in matchers}
                continue
            if name not in scrapes.names:
                if name not in ELSEWHERE:
                    found.append(f"{where}: no metric {name} in the scrapes")
                continue
            labels = scrapes.labels.get(name, {})
            known_labels |= set(labels)
            for label, op, val in matchers:
                if label not in labels:
                    found.append(f"{where}: {name} has no label {label} (it has {sorted(labels)})")
                elif op == "=" and val not in labels[label] and not documented(name, val):
                    found.append(f"{where}: {name}{{{label}={val!r}}} neither scraped nor documented")
        for label in grouping - known_labels:
            found.append(f"{where}: groups by {label}, which none of its metrics has")
    return found


def refused_once(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"NOT HTTP\r\n\r\n")
        s.recv(1024)


def test_every_alert_and_panel_names_metrics_a_real_fleet_produces(tmp_path: Path) -> None:
    assert len(expressions()) > 40
    with own_database("postgres", tmp_path, "yoke_alerts") as db_url:
        server = start_server(db_url, tmp_path / ".yoke", args=("--app", APP, "--no-executor"), **FAST)
        worker = None
        try:
            t = Tenant(server)
            t.create("counter", key="a")
            t.create("flaky", key="a")
            t.http.post("/v1/streams/a/-/events", json=[{"type": "count.x"}, {"type": "flaky.fail"}]).raise_for_status()
            copy = {"name": "archive", "receiver": {"kind": "copy", "target": "/a-archive"}, "start": "beginning"}
            assert t.http.post("/v1/streams/a/-/subscriptions", json=copy).status_code == 201
            # No worker yet: fan-out lags (sampled by the server).
            lag = f'yoke_fanout_lag_events{{tenant="{t.name}"}}'
            lagging = wait_for(lambda: (s := t.http.get("/metrics").text) and value(s, lag) and s, "a fan-out lag")
            port = free_port()
            worker = start_worker(db_url, tmp_path, port)
            dead = f'yoke_failures{{age="under_1m",kind="dead_letter",receiver="actor",tenant="{t.name}"}}'
            delivered = f'yoke_subscription_delivered_total{{name="archive",path="",tenant="{t.name}"}}'

            def worked() -> str:
                try:
                    s = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                except httpx.TransportError:
                    return ""
                # The copies in /a-archive are flaky.fail too: a dead letter each.
                return s if (value(s, dead) or 0) >= 1 and (value(s, delivered) or 0) >= 2 else ""

            from_worker = wait_for(worked, "the worker's dead letter and deliveries")
            refused_once(server.url)
            t.http.post("/v1/streams/a/-/events", json={"type": "count.y"}).raise_for_status()
            from_server = t.http.get("/metrics").text
            t.http.close()
        finally:
            if worker is not None:
                stop_worker(worker)
            stop_server(server)
    assert problems(Scrapes([lagging, from_worker, from_server])) == []
