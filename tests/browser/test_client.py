"""yoke-sdk/client in a browser (Debian's chromium): the module imported as
it is, on a page of the server's origin, appends with an idempotency key,
reads a page, and follows a live tail over fetch's streaming body."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.http.conftest import Server

CLIENT = Path(__file__).resolve().parents[2] / "yoke" / "hosts" / "node" / "client.js"

SCRIPT = """
async ([source, token]) => {
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  const { YokeClient } = await import(url);
  const yoke = new YokeClient({ url: location.origin, token });
  const first = await yoke.append("/browser", { type: "hello", payload: { n: 1 } }, { idempotencyKey: "b-1" });
  const again = await yoke.append("/browser", { type: "hello", payload: { n: 1 } }, { idempotencyKey: "b-1" });
  const page = await yoke.read("/browser", { after: 0 });
  const controller = new AbortController();
  const seen = [];
  const tailing = (async () => {
    for await (const event of yoke.tail("/browser", { after: first.offset, signal: controller.signal })) {
      seen.push(event.payload.n);
      controller.abort();
    }
  })().catch((err) => { if (!controller.signal.aborted) throw err; });
  await yoke.append("/browser", { type: "hello", payload: { n: 2 } });
  await tailing;
  let refused = null;
  try { await yoke.append("/browser", { payload: {} }); } catch (err) { refused = [err.status, err.code]; }
  return { same: first.offset === again.offset, read: page.events.map((e) => e.payload.n), seen, refused };
}
"""


def test_the_client_runs_in_a_browser(page: Any, server: Server) -> None:
    page.goto(server.url + "/healthz")
    result = page.evaluate(SCRIPT, [CLIENT.read_text(), server.token])
    assert result == {"same": True, "read": [1], "seen": [2], "refused": [400, result["refused"][1]]}
    assert result["refused"][1].startswith("invalid_event")
