// Reference token ids for tests/tokenize: reads a JSON list of strings and writes, for each, the
// ids that HF's Rust tokenizers (npm `tokenizers`, prebuilt binary) and tokenizers.js (npm
// `@huggingface/tokenizers`) give with the post-processor's special tokens.
// usage: node ref_encode.mjs NODE_MODULES_DIR TOKENIZER_DIR STRINGS.json OUT.json
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const [modules, dir, inPath, outPath] = process.argv.slice(2);
const require = createRequire(path.join(modules, "x.js"));
const rust = require("tokenizers");
const { Tokenizer: JsTokenizer } = require("@huggingface/tokenizers");

const strings = JSON.parse(fs.readFileSync(inPath, "utf8"));
const tokenizerJson = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
const js = new JsTokenizer(tokenizerJson, tokenizerConfig);
const rs = rust.Tokenizer.fromFile(path.join(dir, "tokenizer.json"));

const encodings = await rs.encodeBatch(strings, { addSpecialTokens: true });
const out = strings.map((s, i) => ({ rust: Array.from(encodings[i].getIds()), js: Array.from(js.encode(s).ids) }));
fs.writeFileSync(outPath, JSON.stringify(out));
