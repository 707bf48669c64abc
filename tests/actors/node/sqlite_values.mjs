// SQLite values through the Node host (tests/actors/sqlite_values_app.py):
// store the event's values, read them back, keep what was read (tagged).
// A "bad" event: how a failing op and an unencodable param reach the handler.

function fromWire(v) {
  if (v === null || typeof v !== "object") return v;
  if ("$blob" in v) return new Uint8Array(Buffer.from(v.$blob, "base64"));
  if ("$int" in v) return BigInt(v.$int);
  if ("$real" in v) return Number(v.$real);
  throw new Error(`not a tagged value: ${JSON.stringify(v)}`);
}

function toWire(v) {
  if (v instanceof Uint8Array) return { $blob: Buffer.from(v).toString("base64") };
  if (typeof v === "bigint") return { $int: v.toString() };
  if (v === Infinity || v === -Infinity) return { $real: String(v) };
  if (typeof v === "number" && Number.isInteger(v) && !Number.isSafeInteger(v)) return { $real: String(v) };
  return v;
}

export async function process(ctx, event) {
  if (event.type === "bad") {
    const codes = {};
    try {
      await ctx.sqlite.query("SELECT CAST(x'ff' AS TEXT) AS t");
    } catch (err) {
      codes.op = err.code;
    }
    try {
      await ctx.state.set({ big: 10n });
    } catch (err) {
      codes.params = err.code;
    }
    try {
      await ctx.state.set({ half: "\ud83d" }); // a lone surrogate: JSON.stringify escapes it
    } catch (err) {
      codes.surrogate = err.code;
    }
    await ctx.state.set(codes);
    return;
  }
  const values = event.payload.values.map(fromWire);
  await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS v (n INTEGER PRIMARY KEY, x)");
  for (const [n, x] of values.entries()) {
    await ctx.sqlite.exec("INSERT INTO v VALUES (?, ?)", [n, x]);
  }
  const rows = await ctx.sqlite.query("SELECT x, typeof(x) AS t FROM v ORDER BY n");
  await ctx.state.set({ back: rows.map((r) => toWire(r.x)), types: rows.map((r) => r.t) });
}
