// Reference decoder for run-gen's text output: @lenml/tokenizers (a port of
// Hugging Face tokenizers) decodes space-separated ids and prints the text
// followed by a newline unless it ends with one (as run-gen ends its text
// before the ids line).  Tokens that tokenizer_config.json marks special
// (e.g. <|im_end|>) are skipped; the other added tokens (<think>,
// <tool_call>, ...) are text, as transformers decodes them with
// skip_special_tokens (the fixture's tokenizer.json flags all added tokens
// special, its tokenizer_config.json only the <|...|> ones).
//   node detok-ref.mjs TOKENIZER.json IDS_FILE OUT_FILE [IDS_FILE OUT_FILE ...]
// where IDS_FILE holds one line "ID ID ..." (several pairs: one node start).
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { TokenizerLoader } from "@lenml/tokenizers";

const [tjPath, ...pairs] = process.argv.slice(2);
const cfgPath = join(dirname(tjPath), "tokenizer_config.json");
const cfg = existsSync(cfgPath) ? JSON.parse(readFileSync(cfgPath, "utf8")) : {};
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(tjPath, "utf8")),
  tokenizerConfig: cfg,
});
const special = new Set(
  Object.entries(cfg.added_tokens_decoder ?? {}).filter(([, t]) => t.special).map(([id]) => Number(id)));
for (let i = 0; i + 1 < pairs.length; i += 2) {
  const ids = readFileSync(pairs[i], "utf8").trim();
  const list = (ids === "" ? [] : ids.split(/\s+/).map(Number)).filter((id) => !special.has(id));
  const text = tok.decode(list, { skip_special_tokens: false });
  writeFileSync(pairs[i + 1], text === "" || text.endsWith("\n") ? text : text + "\n");
}
