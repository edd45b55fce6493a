// s3r's GGUF export checked in llama.cpp (node-llama-cpp's prebuilt CPU build): each model loads,
// its next-token log-probabilities after every prompt token match s3r's own forward
// (`s3r generate --dump-logprobs`) within the model's tolerance, and greedy generation gives the
// same tokens as `s3r generate --temperature 0`. Models exported with a deliberate bug must fail
// the same comparison, so that it is shown to catch such bugs.
//
// A non-finite number on either side (a NaN or infinite llama.cpp logit, a NaN, infinite or
// missing s3r log-probability: JSON has no NaN, s3r writes null) fails the comparison: NaN
// compares false with everything, so a NaN difference would otherwise never exceed the tolerance.
//
// Usage: node check_gguf.mjs LOGPROBS.json GREEDY_IDS SPEC...
//   GREEDY_IDS  the ids s3r generated greedily after the prompt, comma-separated
//   SPEC        MODEL.gguf:TOLERANCE:EXPECT[:greedy], EXPECT one of
//                 match      every log-probability finite and within TOLERANCE (and with :greedy,
//                            the same greedy tokens);
//                 mismatch   fails the comparison (with :greedy: other greedy tokens too);
//                 nonfinite  fails it because llama.cpp's logits hold NaN or infinity.
// Prints the largest difference per model; exit 0 when every model did as expected, 1 when not
// ("FAIL"), 2 when llama.cpp cannot load or run a model.
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [dumpPath, greedyCsv, ...specs] = process.argv.slice(2);
const dump = JSON.parse(fs.readFileSync(dumpPath, "utf8"));
const prompt = dump.prompt_ids;
const want = greedyCsv.length ? greedyCsv.split(",").map(Number) : [];
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});

// The largest |log p_llama.cpp - log p_s3r| over every prompt position and every token, the
// count and first place of non-finite numbers on each side, and llama.cpp's greedy continuation
// of the prompt.
async function compare(modelPath, greedy) {
  const model = await llama.loadModel({modelPath});
  const context = await model.createContext({
    contextSize: 64, batchSize: 64, sequences: 1, flashAttention: false,
    // One thread: a model this small gains nothing from more, while llama.cpp's spinning worker
    // threads on a busy machine made each greedy token cost about a second (measured 37 s
    // against 1.7 s for two models).
    threads: 1,
    // The KV cache in f32 (llama.cpp's default is f16, which would round K and V).
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
  });
  const sequence = context.getSequence();
  const input = prompt.map((t) => [t, {generateNext: {logits: true, options: {temperature: 0}}}]);
  const out = await sequence.controlledEvaluate(input);
  let worst = 0, where = "";
  const bad = {llama: 0, s3r: 0, llamaWhere: "", s3rWhere: ""};
  for (let i = 0; i < prompt.length; ++i) {
    const logits = out[i]?.next?.logits;
    const expect = dump.logprobs[i];
    if (!logits || logits.size !== expect.length) {
      throw new Error(`llama.cpp returned ${logits?.size} logits after prompt token ${i}, s3r ${expect.length}`);
    }
    for (const [token, v] of logits) {
      if (!Number.isFinite(v) && bad.llama++ === 0) bad.llamaWhere = `position ${i}, token ${token}: ${v}`;
    }
    for (let token = 0; token < expect.length; ++token) {
      if (!Number.isFinite(expect[token]) && bad.s3r++ === 0) bad.s3rWhere = `position ${i}, token ${token}: ${expect[token]}`;
    }
    let max = -Infinity, sum = 0;
    for (const v of logits.values()) max = Math.max(max, v);
    for (const v of logits.values()) sum += Math.exp(v - max);
    const lse = max + Math.log(sum);
    for (const [token, v] of logits) {
      const e = typeof expect[token] === "number" ? expect[token] : NaN;  // null would count as 0
      const d = Math.abs((v - lse) - e);
      // `!(d <= worst)`: a NaN difference (from either side) is the worst there is, not skipped.
      if (!(d <= worst) && Number.isFinite(worst)) {
        worst = Number.isNaN(d) ? NaN : d;
        where = `position ${i}, token ${token}: llama.cpp ${(v - lse).toFixed(6)}, s3r ${expect[token]?.toFixed?.(6) ?? expect[token]}`;
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
  return {worst, where, got, bad};
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
  if (!["match", "mismatch", "nonfinite"].includes(expect) || !(tolerance >= 0)) {
    console.log(`FAIL: bad spec '${spec}' (MODEL.gguf:TOLERANCE:match|mismatch|nonfinite[:greedy])`);
    ok = false;
    continue;
  }
  let r;
  try {
    r = await compare(path, greedyFlag === "greedy");
  } catch (e) {
    console.error(`llama.cpp cannot load or run ${path}: ${e.message}`);
    process.exit(2);
  }
  const total = prompt.length * dump.logprobs[0].length;
  const finite = r.bad.llama === 0 && r.bad.s3r === 0;
  const matches = finite && r.worst <= tolerance;
  console.log(`${path}: ${prompt.length} positions x ${dump.logprobs[0].length} tokens, max |log-prob difference| ` +
              `${r.worst.toExponential(3)} (tolerance ${tolerance}; expected: ${expect}) at ${r.where}`);
  if (r.bad.llama) console.log(`  non-finite: ${r.bad.llama} of ${total} llama.cpp logits (first at ${r.bad.llamaWhere})`);
  if (r.bad.s3r) console.log(`  non-finite: ${r.bad.s3r} of ${total} s3r log-probabilities (first at ${r.bad.s3rWhere})`);
  if (expect === "match" && !matches) {
    console.log(`FAIL: ${path} was expected to match: ` +
                (finite ? `difference ${r.worst.toExponential(3)} above the tolerance ${tolerance}`
                        : "non-finite numbers (above)"));
    ok = false;
  } else if (expect === "mismatch" && matches) {
    console.log(`FAIL: ${path} was expected to mismatch, but it is within the tolerance ${tolerance}`);
    ok = false;
  } else if (expect === "nonfinite" && r.bad.llama === 0) {
    console.log(`FAIL: ${path} was expected to give non-finite llama.cpp logits, but every logit is finite`);
    ok = false;
  }
  if (greedyFlag === "greedy") {
    const same = r.got.length === want.length && r.got.every((t, i) => t === want[i]);
    console.log(`  greedy llama.cpp: ${r.got.join(",")}`);
    console.log(`  greedy s3r:       ${want.join(",")}`);
    if (same !== (expect === "match")) {
      console.log(`FAIL: ${path}: greedy generation ${same ? "is the same as" : "differs from"} s3r generate's ` +
                  `(expected: ${expect === "match" ? "the same" : "different"})`);
      ok = false;
    }
  }
}
console.log(ok ? "llama.cpp check: ok" : "llama.cpp check: FAILED");
process.exit(ok ? 0 : 1);
