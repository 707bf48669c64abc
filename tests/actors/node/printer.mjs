// Prints, then fails or not as the event says (tests/actors/test_host_output.py).
console.log("loaded printer.mjs");

export async function process(ctx, event) {
  console.log("charging", { order: event.payload.order, cents: 4200 });
  console.error(`attempt ${ctx.attempt} on stderr`);
  console.log("x".repeat(4095) + "😀"); // cut at 4 KiB between the halves of the pair
  if (event.payload.fail) throw new Error("card declined");
}
