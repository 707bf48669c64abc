// Prints, then fails or not as the event says (tests/actors/test_host_output.py).
console.log("loaded printer.mjs");

export async function process(ctx, event) {
  console.log("charging", { order: event.payload.order, cents: 4200 });
  console.error(`attempt ${ctx.attempt} on stderr`);
  if (event.payload.fail) throw new Error("card declined");
}
