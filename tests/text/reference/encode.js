#!/usr/bin/env node
// The reference side of tests/text: real tokenizer files and an independent encoder.
//
//   node encode.js CORPUS.jsonl OUT_DIR
//
// For each model it writes OUT_DIR/models/<model>/ (tokenizer.json, tokenizer_config.json, as
// the npm packages ship them) and OUT_DIR/ids/<model>.jsonl, one line per corpus line:
//   text lines:    {"ids": [...], "ids_special": [...], "nfc": "...", "decoded": "...",
//                   "decoded_skip_special": "..."}
//   decode lines:  {"ids": [...], "decoded": "...", "text_decoder": "..."}; for gemma3 the ids are
//                  the bytes' <0xNN> tokens and "hf_decoded" is what HF tokenizers' ByteFallback
//                  (Rust) gives: the bytes when they are UTF-8, else one U+FFFD per byte
//                  (transformers.js decodes such a run as TextDecoder does instead)
//   other lines:   {}
// Models: qwen3, llama3 and gemma3 as shipped; llama3-bos: llama3 with the post-processor Meta's
// current tokenizer.json has (ByteLevel, then TemplateProcessing adding <|begin_of_text|>),
// since the packaged file predates it and adds nothing; qwen3-strip: qwen3 with lstrip/rstrip
// on some added tokens; gemma3-unk: gemma3 without byte fallback (a character missing from the
// vocabulary becomes <unk>, consecutive ones one <unk>: fuse_unk).
"use strict";
const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require("@lenml/tokenizers");

const [corpusPath, outDir] = process.argv.slice(2);
if (!corpusPath || !outDir) {
  console.error("usage: node encode.js CORPUS.jsonl OUT_DIR");
  process.exit(2);
}

function packageModels(name) {
  return path.dirname(require.resolve(`@lenml/tokenizer-${name}/models/tokenizer.json`));
}

function readJson(file) {
  return JSON.parse(fs.readFileSync(file, "utf8"));
}

// GPT-2's byte alphabet: printable bytes stand for themselves, the others for U+0100 + n.
function byteToChar() {
  const table = [];
  let next = 0x100;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    table.push(String.fromCodePoint(printable ? b : next++));
  }
  return table;
}

const llama3BosPostProcessor = {
  type: "Sequence",
  processors: [
    { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    {
      type: "TemplateProcessing",
      single: [
        { SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } },
        { Sequence: { id: "A", type_id: 0 } },
      ],
      pair: [
        { SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } },
        { Sequence: { id: "A", type_id: 0 } },
        { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } },
        { Sequence: { id: "B", type_id: 1 } },
      ],
      special_tokens: {
        "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [128000], tokens: ["<|begin_of_text|>"] },
      },
    },
  ],
};

// Added tokens that swallow the whitespace beside them (lstrip / rstrip): no model here has
// them, so qwen3-strip gives some of Qwen3's tokens those flags.
const stripFlags = {
  "<|im_end|>": { lstrip: true, rstrip: true },
  "<|endoftext|>": { lstrip: true },
  "<think>": { rstrip: true },
};

const models = [
  { name: "qwen3", source: packageModels("qwen3") },
  { name: "qwen3-strip", source: packageModels("qwen3"), addedTokenFlags: stripFlags },
  { name: "llama3", source: packageModels("llama3") },
  { name: "llama3-bos", source: packageModels("llama3"), postProcessor: llama3BosPostProcessor },
  { name: "gemma3", source: packageModels("gemma3"), byteFallback: true },
  { name: "gemma3-unk", source: packageModels("gemma3"), byteFallback: true, model: { byte_fallback: false } },
];

const corpus = fs
  .readFileSync(corpusPath, "utf8")
  .split("\n")
  .filter((line) => line.trim() !== "")
  .map((line) => JSON.parse(line));
const bytesToChars = byteToChar();
const textDecoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const strictDecoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const hex2 = (b) => b.toString(16).toUpperCase().padStart(2, "0");
function byteFallbackDecode(bytes) {
  try {
    return strictDecoder.decode(bytes);
  } catch {
    return "\uFFFD".repeat(bytes.length);
  }
}
const noCleanup = { clean_up_tokenization_spaces: false };

for (const model of models) {
  const tokenizerJSON = readJson(path.join(model.source, "tokenizer.json"));
  const tokenizerConfig = readJson(path.join(model.source, "tokenizer_config.json"));
  if (model.postProcessor) tokenizerJSON.post_processor = model.postProcessor;
  Object.assign(tokenizerJSON.model, model.model);
  for (const token of tokenizerJSON.added_tokens) Object.assign(token, model.addedTokenFlags?.[token.content]);
  const modelDir = path.join(outDir, "models", model.name);
  fs.mkdirSync(modelDir, { recursive: true });
  fs.writeFileSync(path.join(modelDir, "tokenizer.json"), JSON.stringify(tokenizerJSON));
  fs.writeFileSync(path.join(modelDir, "tokenizer_config.json"), JSON.stringify(tokenizerConfig));

  const tokenizer = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  const out = [];
  for (const entry of corpus) {
    if (entry.kind === "invalid") {
      out.push("{}");
    } else if (entry.kind === "decode") {
      const bytes = Buffer.from(entry.hex, "hex");
      const tokens = [...bytes].map((b) => (model.byteFallback ? `<0x${hex2(b)}>` : bytesToChars[b]));
      const ids = tokenizer.model.convert_tokens_to_ids(tokens).map(Number);
      const line = { ids, decoded: tokenizer.decode(ids, noCleanup), text_decoder: textDecoder.decode(bytes) };
      if (model.byteFallback) line.hf_decoded = byteFallbackDecode(bytes);
      out.push(JSON.stringify(line));
    } else {
      const ids = tokenizer.encode(entry.text, { add_special_tokens: false }).map(Number);
      const idsSpecial = tokenizer.encode(entry.text, { add_special_tokens: true }).map(Number);
      out.push(
        JSON.stringify({
          ids,
          ids_special: idsSpecial,
          nfc: entry.text.normalize("NFC"),
          decoded: tokenizer.decode(ids, noCleanup),
          decoded_skip_special: tokenizer.decode(ids, { ...noCleanup, skip_special_tokens: true }),
        })
      );
    }
  }
  fs.mkdirSync(path.join(outDir, "ids"), { recursive: true });
  fs.writeFileSync(path.join(outDir, "ids", `${model.name}.jsonl`), out.join("\n") + "\n");
  console.log(`${model.name}: ${corpus.length} lines`);
}
