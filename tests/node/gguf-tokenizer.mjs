// Rebuilds a Hugging Face tokenizer.json object from the tokenizer.ggml.*
// metadata of a byte-level BPE GGUF (Qwen2 pre-tokenizer), so that a
// reference tokenizer can run on a vocabulary we only have as GGUF.
// Reads only the metadata; tensor data is never touched.
import { openSync, readSync, closeSync, fstatSync } from "node:fs";

function readMeta(path) {
  const fd = openSync(path, "r");
  const size = fstatSync(fd).size;
  // The metadata of a vocabulary-only file is small; read up to 64 MiB.
  const n = Math.min(size, 64 << 20);
  const buf = Buffer.alloc(n);
  readSync(fd, buf, 0, n, 0);
  closeSync(fd);
  let o = 0;
  const u32 = () => { const v = buf.readUInt32LE(o); o += 4; return v; };
  const u64 = () => { const v = Number(buf.readBigUInt64LE(o)); o += 8; return v; };
  const str = () => { const l = u64(); const s = buf.toString("utf8", o, o + l); o += l; return s; };
  const scalar = (t) => {
    switch (t) {
      case 0: o += 1; return buf.readUInt8(o - 1);
      case 1: o += 1; return buf.readInt8(o - 1);
      case 2: o += 2; return buf.readUInt16LE(o - 2);
      case 3: o += 2; return buf.readInt16LE(o - 2);
      case 4: return u32();
      case 5: o += 4; return buf.readInt32LE(o - 4);
      case 6: o += 4; return buf.readFloatLE(o - 4);
      case 7: o += 1; return buf.readUInt8(o - 1) !== 0;
      case 8: return str();
      case 10: return u64();
      case 11: o += 8; return Number(buf.readBigInt64LE(o - 8));
      case 12: o += 8; return buf.readDoubleLE(o - 8);
      default: throw new Error(`gguf: bad type ${t}`);
    }
  };
  if (buf.readUInt32LE(0) !== 0x46554747) throw new Error(`${path}: not a GGUF file`);
  o = 8;
  u64(); // tensors
  const nkv = u64();
  const kv = {};
  for (let i = 0; i < nkv; i++) {
    const key = str();
    const t = u32();
    if (t === 9) {
      const et = u32();
      const len = u64();
      const arr = new Array(len);
      for (let j = 0; j < len; j++) arr[j] = scalar(et);
      kv[key] = arr;
    } else {
      kv[key] = scalar(t);
    }
  }
  return kv;
}

export function tokenizerFromGGUF(path) {
  const kv = readMeta(path);
  if (kv["tokenizer.ggml.model"] !== "gpt2") throw new Error(`${path}: not a byte-level BPE vocabulary`);
  const tokens = kv["tokenizer.ggml.tokens"];
  const types = kv["tokenizer.ggml.token_type"];
  const vocab = {};
  const added = [];
  tokens.forEach((t, id) => {
    // control (3) and user-defined (4) tokens are the added tokens
    if (types[id] === 3 || types[id] === 4) {
      added.push({ id, content: t, single_word: false, lstrip: false, rstrip: false,
                   normalized: false, special: types[id] === 3 });
    }
    vocab[t] = id;
  });
  const regex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: { type: "NFC" },
    pre_tokenizer: {
      type: "Sequence",
      pretokenizers: [
        { type: "Split", pattern: { Regex: regex }, behavior: "Isolated", invert: false },
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
      ],
    },
    post_processor: null,
    decoder: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
      end_of_word_suffix: "", fuse_unk: false, byte_fallback: false, ignore_merges: false,
      vocab, merges: kv["tokenizer.ggml.merges"],
    },
  };
  const config = { tokenizer_class: "Qwen2Tokenizer", add_bos_token: false, bos_token: null,
                   eos_token: null, pad_token: null, model_max_length: 1 << 30 };
  return { json, config };
}
