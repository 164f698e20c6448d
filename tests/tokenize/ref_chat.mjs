// Reference ids and loss masks for tests/tokenize/test_chat.py: each rendered conversation is
// encoded by HF's Rust tokenizers (npm `tokenizers`) without added special tokens, and a token is
// a target when it lies between the tokens holding the first and the last character of an
// assistant span, found with charToToken as transformers' return_assistant_tokens_mask does.
// usage: node ref_chat.mjs NODE_MODULES_DIR TOKENIZER_DIR IN.json OUT.json
// IN.json: [{"text": str, "spans": [[start, end], ...]}] with spans in code points.
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const [modules, dir, inPath, outPath] = process.argv.slice(2);
const require = createRequire(path.join(modules, "x.js"));
const rust = require("tokenizers");
const rs = rust.Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
const items = JSON.parse(fs.readFileSync(inPath, "utf8"));
const encodings = await rs.encodeBatch(items.map((x) => x.text), { addSpecialTokens: false });
const out = items.map((x, i) => {
  const e = encodings[i];
  const ids = Array.from(e.getIds());
  const mask = ids.map(() => 0);
  for (const [start, end] of x.spans) {
    const first = e.charToToken(start);
    const last = e.charToToken(end - 1);
    if (first === null || first === undefined) break;
    const stop = last === null || last === undefined ? ids.length : last + 1;
    for (let t = first; t < stop; t++) mask[t] = 1;
  }
  return { ids, mask };
});
fs.writeFileSync(outPath, JSON.stringify(out));
