// The reference side of bench/tokenize_speed.sh: HF's Rust tokenizers (npm `tokenizers`, a
// prebuilt native binary) encoding the corpus with encodeBatch, in batches of 2,000 documents
// (the whole corpus at once holds every Encoding object in memory). Prints tokens, seconds and
// tokens/s of the encodeBatch calls alone, and the CPU seconds the process used meanwhile (a
// measure that a loaded machine disturbs less than wall time). The thread count comes from RAYON_NUM_THREADS.
// usage: node tokenize_rust.mjs NODE_MODULES_DIR TOKENIZER_JSON CORPUS.json
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const [modules, tokenizerJson, corpus] = process.argv.slice(2);
const require = createRequire(path.join(modules, "x.js"));
const rust = require("tokenizers");
const tok = rust.Tokenizer.fromFile(tokenizerJson);
const docs = JSON.parse(fs.readFileSync(corpus, "utf8"));
let tokens = 0, seconds = 0;
const cpu0 = process.cpuUsage();
for (let i = 0; i < docs.length; i += 2000) {
  const batch = docs.slice(i, i + 2000);
  const t0 = process.hrtime.bigint();
  const enc = await tok.encodeBatch(batch, { addSpecialTokens: true });
  seconds += Number(process.hrtime.bigint() - t0) / 1e9;
  for (const e of enc) tokens += e.getIds().length;
}
const cpu = process.cpuUsage(cpu0);
const cpuSeconds = (cpu.user + cpu.system) / 1e6;
console.log(`tokenizers (Rust) encodeBatch: ${tokens} tokens in ${seconds.toFixed(2)} s: ${Math.round(tokens / seconds)} tokens/s; ` +
  `${cpuSeconds.toFixed(2)} CPU s: ${Math.round(tokens / cpuSeconds)} tokens per CPU s`);
