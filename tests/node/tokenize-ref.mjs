// Prints, for each test string of a .inp file (strings separated by the line
// __ggml_vocab_test__), one line of space-separated ids from @lenml/tokenizers
// loaded from a tokenizer.json (+ tokenizer_config.json beside it).
//   node tokenize-ref.mjs TOKENIZER.json FILE.inp
import { readFileSync, existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { TokenizerLoader } from "@lenml/tokenizers";

const [tjPath, inp] = process.argv.slice(2);
const cfgPath = join(dirname(tjPath), "tokenizer_config.json");
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(tjPath, "utf8")),
  tokenizerConfig: existsSync(cfgPath) ? JSON.parse(readFileSync(cfgPath, "utf8")) : {},
});
const parts = readFileSync(inp, "utf8").split("\n__ggml_vocab_test__\n");
if (parts.length && parts[parts.length - 1] === "") parts.pop();
let out = "";
for (const s of parts) out += tok.encode(s, { add_special_tokens: false }).join(" ") + "\n";
process.stdout.write(out);
