// s3r's GGUF export checked in llama.cpp (node-llama-cpp's prebuilt CPU build): each model loads,
// its next-token log-probabilities after every prompt token match s3r's own forward
// (`s3r generate --dump-logprobs`) within the model's tolerance, and greedy generation gives the
// same tokens as `s3r generate --temperature 0`. Models exported with a deliberate bug must fail
// the same comparison, so that it is shown to catch such bugs.
//
// Usage: node check_gguf.mjs LOGPROBS.json GREEDY_IDS SPEC...
//   GREEDY_IDS  the ids s3r generated greedily after the prompt, comma-separated
//   SPEC        MODEL.gguf:TOLERANCE:match|mismatch[:greedy]
// Prints the largest difference per model; exit 0 when every model did as expected, 1 when not
// ("FAIL"), 2 when llama.cpp cannot load or run a model.
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [dumpPath, greedyCsv, ...specs] = process.argv.slice(2);
const dump = JSON.parse(fs.readFileSync(dumpPath, "utf8"));
const prompt = dump.prompt_ids;
const want = greedyCsv.length ? greedyCsv.split(",").map(Number) : [];
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});

// The largest |log p_llama.cpp - log p_s3r| over every prompt position and every token, and
// llama.cpp's greedy continuation of the prompt.
async function compare(modelPath, greedy) {
  const model = await llama.loadModel({modelPath});
  const context = await model.createContext({
    contextSize: 64, batchSize: 64, sequences: 1, flashAttention: false,
    // The KV cache in f32 (llama.cpp's default is f16, which would round K and V).
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
  });
  const sequence = context.getSequence();
  const input = prompt.map((t) => [t, {generateNext: {logits: true, options: {temperature: 0}}}]);
  const out = await sequence.controlledEvaluate(input);
  let worst = 0, where = "";
  for (let i = 0; i < prompt.length; ++i) {
    const logits = out[i]?.next?.logits;
    const expect = dump.logprobs[i];
    if (!logits || logits.size !== expect.length) {
      throw new Error(`llama.cpp returned ${logits?.size} logits after prompt token ${i}, s3r ${expect.length}`);
    }
    let max = -Infinity, sum = 0;
    for (const v of logits.values()) max = Math.max(max, v);
    for (const v of logits.values()) sum += Math.exp(v - max);
    const lse = max + Math.log(sum);
    for (const [token, v] of logits) {
      const d = Math.abs((v - lse) - expect[token]);
      if (d > worst) {
        worst = d;
        where = `position ${i}, token ${token}: llama.cpp ${(v - lse).toFixed(6)}, s3r ${expect[token].toFixed(6)}`;
      }
    }
  }
  const got = [];
  if (greedy) {
    await sequence.clearHistory();
    for await (const token of sequence.evaluate(prompt, {temperature: 0, yieldEogToken: true})) {
      got.push(token);
      if (got.length >= want.length) break;
    }
  }
  await context.dispose();
  await model.dispose();
  return {worst, where, got};
}

let ok = true;
// llama.cpp's own SentencePiece tokenizer on the prompt text gives s3r's ids (after the
// document-start token, which both add: s3r generate, and llama.cpp's add_bos_token).
{
  const model = await llama.loadModel({modelPath: specs[0].split(":")[0]});
  const theirs = model.tokenize(dump.prompt);
  const ours = dump.document_start ? prompt.slice(1) : prompt;
  console.log(`tokenizer: llama.cpp ${theirs.join(",")} (BOS ${model.tokens.bos}); s3r ${prompt.join(",")}`);
  if (theirs.length !== ours.length || !theirs.every((t, i) => t === ours[i]) ||
      (dump.document_start && model.tokens.bos !== prompt[0])) {
    console.log("FAIL: llama.cpp tokenizes the prompt differently");
    ok = false;
  }
  await model.dispose();
}
for (const spec of specs) {
  const [path, tolText, expect, greedyFlag] = spec.split(":");
  const tolerance = Number(tolText);
  let r;
  try {
    r = await compare(path, greedyFlag === "greedy");
  } catch (e) {
    console.error(`llama.cpp cannot load or run ${path}: ${e.message}`);
    process.exit(2);
  }
  const matches = r.worst <= tolerance;
  console.log(`${path}: ${prompt.length} positions x ${dump.logprobs[0].length} tokens, max |log-prob difference| ` +
              `${r.worst.toExponential(3)} (tolerance ${tolerance}; expected to ${expect}) at ${r.where}`);
  if (matches !== (expect === "match")) {
    console.log(`FAIL: ${path} was expected to ${expect}`);
    ok = false;
  }
  if (greedyFlag === "greedy") {
    const same = r.got.length === want.length && r.got.every((t, i) => t === want[i]);
    console.log(`  greedy llama.cpp: ${r.got.join(",")}`);
    console.log(`  greedy s3r:       ${want.join(",")}`);
    if (!same) {
      console.log(`FAIL: ${path}: greedy generation differs from s3r generate's`);
      ok = false;
    }
  }
}
console.log(ok ? "llama.cpp check: ok" : "llama.cpp check: FAILED");
process.exit(ok ? 0 : 1);
