// Reference prompt ids of a chat request: the GGUF's chat template rendered
// by @huggingface/jinja, tokenized by @lenml/tokenizers (special tokens
// parsed).  Prints the ids space-separated.
//   node chat-prompt-ref.mjs MODEL.gguf BODY.json
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";
import { TokenizerLoader } from "@lenml/tokenizers";
import { readMeta, tokenizerFromGGUF } from "./gguf-tokenizer.mjs";

const [gguf, bodyPath] = process.argv.slice(2);
const kv = readMeta(gguf);
const body = JSON.parse(readFileSync(bodyPath, "utf8"));
const tokens = kv["tokenizer.ggml.tokens"];
const tokText = (k) => (kv[k] !== undefined ? tokens[kv[k]] : "");
const ctx = {
  messages: body.messages,
  add_generation_prompt: body.add_generation_prompt ?? true,
  bos_token: tokText("tokenizer.ggml.bos_token_id"),
  eos_token: tokText("tokenizer.ggml.eos_token_id"),
};
if (body.tools) ctx.tools = body.tools;
if (body.enable_thinking !== undefined) ctx.enable_thinking = body.enable_thinking;
Object.assign(ctx, body.chat_template_kwargs ?? {});
const text = new Template(kv["tokenizer.chat_template"]).render(ctx);
const { json, config } = tokenizerFromGGUF(gguf);
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: config });
console.log(tok.encode(text, { add_special_tokens: false }).join(" "));
