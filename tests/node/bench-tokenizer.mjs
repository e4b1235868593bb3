// Encodes a text file N times with @lenml/tokenizers and prints the median
// throughput; writes the ids (one per line) when an output path is given, so
// that they can be compared with ours.
//   node bench-tokenizer.mjs VOCAB.gguf TEXT N [IDS_OUT]
import { readFileSync, writeFileSync } from "node:fs";
import { TokenizerLoader } from "@lenml/tokenizers";
import { tokenizerFromGGUF } from "./gguf-tokenizer.mjs";

const [gguf, textPath, nStr, idsOut] = process.argv.slice(2);
const { json, config } = tokenizerFromGGUF(gguf);
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: config });
const text = readFileSync(textPath, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
const n = Number(nStr || 3);
const times = [];
let ids;
for (let i = 0; i < n; i++) {
  const t0 = process.hrtime.bigint();
  ids = tok.encode(text, { add_special_tokens: false });
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  times.push(s);
  console.log(`run ${i}: ${bytes} bytes, ${ids.length} tokens, ${s.toFixed(4)} s, ${(bytes / s / 1e6).toFixed(2)} MB/s`);
}
if (idsOut) writeFileSync(idsOut, ids.join("\n") + "\n");
