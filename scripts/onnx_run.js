// ONNX Runtime's side of cnnc's ONNX export test (export/onnx,
// TestExportInONNXRuntime): runs an exported model on one batch.
//
// Usage: NODE_PATH=DIR/node_modules node onnx_run.js MODEL INPUT N C H W OUTPUT
//   INPUT:  N images, float32 NCHW little-endian, in [0,1] (ToTensor's values)
//   OUTPUT: written with the "logits" output, float32 little-endian
// Prints one JSON object: ONNX Runtime's version and the logits' dims.
// onnxruntime-node comes from npm (scripts/install-onnx.sh); nothing else.
"use strict";
const fs = require("fs");
const ort = require("onnxruntime-node");

async function main() {
  const [model, input, n, c, h, w, output] = process.argv.slice(2);
  const dims = [n, c, h, w].map(Number);
  const bytes = fs.readFileSync(input);
  const want = dims.reduce((a, b) => a * b, 1) * 4;
  if (bytes.length !== want) {
    throw new Error(`${input}: ${bytes.length} bytes, want ${want} for [${dims}]`);
  }
  // copy: a Buffer's offset into its pool need not be 4-aligned
  const x = new Float32Array(new Uint8Array(bytes).buffer);
  const session = await ort.InferenceSession.create(model, {
    executionProviders: ["cpu"],
    intraOpNumThreads: 1,
    interOpNumThreads: 1,
  });
  if (session.inputNames.join() !== "image" || session.outputNames.join() !== "logits") {
    throw new Error(`inputs ${session.inputNames}, outputs ${session.outputNames}: want image and logits`);
  }
  const result = await session.run({ image: new ort.Tensor("float32", x, dims) });
  const logits = result.logits;
  if (logits.type !== "float32") {
    throw new Error(`logits are ${logits.type}`);
  }
  fs.writeFileSync(output, Buffer.from(logits.data.buffer, logits.data.byteOffset, logits.data.byteLength));
  console.log(JSON.stringify({ ort_version: ort.env.versions.common, dims: logits.dims }));
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
