// The billing step of tests/tracing/traced_app.py in the Node host: the
// attempt's trace context arrives as ctx.trace.
export async function process(ctx, event) {
  if (ctx.attempt === 1) throw new Error("card declined");
  const seen = ctx.trace === null ? null : ctx.trace.traceparent.split("-")[1];
  await ctx.append({ type: "invoice.sent", payload: { order: event.payload.order, seen } }, "/invoices");
}
