#!/usr/bin/env python3
"""Writes tests/text/corpus.jsonl, the text the tokenizer tests compare with the references.

Run once by hand when the corpus should change (its output is committed):
    /usr/bin/python3 tests/text/make_corpus.py > tests/text/corpus.jsonl

Each line is one JSON object:
  {"kind": ..., "text": "..."}          encoded by the C++ tokenizer and the Node reference
  {"kind": "invalid", "hex": "...", "at": N}
                                        not UTF-8: encode must refuse it, naming byte N
  {"kind": "decode", "hex": "..."}      bytes spelled as byte-level tokens (Gemma: <0xNN>
                                        tokens): decode must give what the reference's decode
                                        and TextDecoder give (Gemma: HF's ByteFallback rule)

The text avoids what the references cannot agree on with HF tokenizers: U+0085, U+FEFF and
U+180E (JavaScript's \\s differs from Oniguruma's), letters and digits newer than Unicode 14
(PCRE2 10.42's tables) and "'" before a non-ASCII case variant (the reference spells the
case-insensitive contraction group as ASCII classes).
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

lines = []


def add(kind, text):
    lines.append({"kind": kind, "text": text})


# --- English prose (written for this corpus) ---------------------------------------------
PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It was a bright cold day in April, and the clocks were striking thirteen.",
    "A training service owns the model; clients send batches and receive losses.",
    "Gradient checkpointing trades compute for memory: it recomputes each layer during the backward pass.",
    "StreamBP splits the chain rule along the sequence, so only one chunk of logits is alive at a time.",
    "She said, \"Don't worry about it,\" and walked away without looking back.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong's first words were heard by 600 million people.",
    "The meeting is at 10:30 a.m. on Tuesday, March 5th, 2024 (room B-204).",
    "Prices rose 3.5% year over year, while wages grew by only 2.1%.",
    "Why would anyone do that?! I can't believe it... Seriously???",
    "Mr. and Mrs. Dursley, of number four, Privet Drive, were proud to say that they were perfectly normal.",
    "Dr. Smith's lab — the one on the 3rd floor — has a new GPU cluster.",
    "E-mail me at jane.doe@example.com or visit https://example.org/docs?page=2&lang=en#intro.",
    "Tokenizers split text into pieces; byte-level BPE never meets an unknown character.",
    "Well, well, well. What have we here?",
    "THE END",
    "all lower case text without any punctuation at all",
    "ALL UPPER CASE TEXT WITH SOME NUMBERS 123 AND SYMBOLS #!",
    "CamelCaseIdentifiersLikeThisOne and snake_case_identifiers_like_this_one.",
    "He'd've gone if he'd known; they'll say we're late, and I'm sure you've heard it's true.",
    "Rock 'n' roll, o'clock, ma'am, y'all, 'tis the season.",
    "The word \"naïve\" and the name \"Zoë\" carry diaeresis; \"café\" and \"résumé\" carry acute accents.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore.",
    "First line\nSecond line\nThird line",
    "Paragraph one.\n\nParagraph two, after a blank line.\n\n\nParagraph three, after two.",
    "Windows line endings\r\nare here\r\n",
    "A sentence that ends with a space ",
    " A sentence that starts with a space",
    "  Two spaces before and after  ",
    "Tabs\tseparate\tthese\twords",
    "Mixed \t whitespace \n\t  here",
]
for p in PROSE:
    add("prose", p)

# The project's README, paragraph by paragraph: real English with Markdown and code.
readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
paragraphs = [p for p in readme.split("\n\n") if p.strip()]
for p in paragraphs[:60]:
    add("readme", p)
add("readme-whole", "\n\n".join(paragraphs[:12]))

# --- code --------------------------------------------------------------------------------
CODE = [
    "int main(int argc, char** argv) {\n  return argc > 1 ? 0 : 1;\n}\n",
    "def f(x):\n    return x ** 2 + 3 * x - 1\n\n\nprint(f(10))\n",
    "for (size_t i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}",
    "const add = (a, b) => a + b; // arrow function\nconsole.log(add(2, 3));",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;",
    "<div class=\"container\"><p id='x'>Hello &amp; welcome</p></div>",
    "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "$ ls -la /usr/lib | grep -E '^d' && echo \"done\" || exit 1",
    "#include <vector>\n#include <string>\n\nnamespace foo {\nstd::vector<std::string> bar;\n}  // namespace foo\n",
    "    if (x == nullptr) {\n        throw std::invalid_argument(\"x\");\n    }\n",
    "x = [i for i in range(100) if i % 3 == 0]\ny = {k: v for k, v in zip(a, b)}",
    "fn main() { let v: Vec<u32> = (0..10).collect(); println!(\"{:?}\", v); }",
    "\\begin{equation}\n  E = mc^2 \\quad \\text{and} \\quad \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&=8;i|=9;j^=10;",
    "if __name__ == \"__main__\":\n\tmain()\n",
    "        deeply_indented_call(arg1,\n                             arg2)\n",
    "   \t\n  \t  mixed indentation before code\n",
    "// TODO(someone): fix this!!!\n/* block\n * comment\n */",
    "git commit -m \"Fix the bug\" && git push origin main",
    "key1=value1\nkey2 = value2\n[section]\nname=\"quoted value\"",
]
for c in CODE:
    add("code", c)
for path in ["core/include/streambp/error.h", "tests/cli/common.sh", "CMakeLists.txt"]:
    src = open(os.path.join(ROOT, path), encoding="utf-8").read()
    add("code-file", src[:3000])

# --- CJK and other scripts ------------------------------------------------------------------
SCRIPTS = [
    "你好，世界！今天天气很好。",
    "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
    "我喜欢吃苹果和香蕉，但是不喜欢吃榴莲。",
    "北京是中华人民共和国的首都，人口超过两千万。",
    "「引号」和『双引号』，还有《书名号》。",
    "日本語のテキストです。ひらがな、カタカナ、漢字が混ざっています。",
    "東京タワーは高さ333メートルです。",
    "ｶﾀｶﾅ半角とＡＢＣ全角と１２３全角数字",
    "안녕하세요, 세계! 한국어 텍스트입니다.",
    "대한민국의 수도는 서울입니다.",
    "Привет, мир! Это текст на русском языке.",
    "Γειά σου Κόσμε! Αυτό είναι ελληνικό κείμενο.",
    "مرحبا بالعالم! هذا نص باللغة العربية.",
    "שלום עולם! זהו טקסט בעברית.",
    "नमस्ते दुनिया! यह हिंदी में पाठ है।",
    "สวัสดีชาวโลก นี่คือข้อความภาษาไทย",
    "Xin chào thế giới! Đây là văn bản tiếng Việt.",
    "გამარჯობა მსოფლიო",
    "Բարեւ աշխարհ",
    "ሰላም ልዑል",
    "Mixed 中文 and English 和 日本語 text 123 テスト!",
    "中文，标点。符号：分号；问号？感叹号！",
    "Ünïcödé ąčęėįšųūž ñ ß æøå œ",
    "١٢٣٤٥ ٦٧٨٩٠ (Arabic-Indic digits)",
    "१२३ (Devanagari digits) ๑๒๓ (Thai digits)",
    "Roman numerals: Ⅰ Ⅱ Ⅲ Ⅻ ⅿ; superscripts x² y³ ½ ¾",
    "∀x ∈ ℝ: x² ≥ 0 ⇒ √(x²) = |x|; ∑ᵢ aᵢ ≠ ∏ⱼ bⱼ",
    "Box: ┌──┐ │ok│ └──┘ ░▒▓█ ←↑→↓ ♠♣♥♦ ☀☁☂",
    "Currency: $100, €85, £70, ¥1000, ₹500, ₩1200, ₿0.5",
]
for s in SCRIPTS:
    add("scripts", s)

# --- emoji ------------------------------------------------------------------------------
EMOJI = [
    "I love pizza 🍕 and ice cream 🍦!",
    "😀😃😄😁😆😅😂🤣",
    "👍👍🏻👍🏼👍🏽👍🏾👍🏿",
    "Family: 👨‍👩‍👧‍👦 couple: 👩‍❤️‍👨 technologist: 🧑‍💻",
    "Flags: 🇺🇸 🇯🇵 🇩🇪 🇫🇷 🇧🇷 🏳️‍🌈 🏴‍☠️",
    "Keycaps: 1️⃣ 2️⃣ #️⃣ *️⃣",
    "Hearts ❤️ ❤ 💙 💚 — with and without VS16",
    "🎉Party🎉time🎉",
    "emoji at the end 🚀",
    "🚀 emoji at the start",
    "A👍B👎C",
    "🏃‍♀️🏃‍♂️💁🏽‍♀️",
    "😀" * 40,
]
for e in EMOJI:
    add("emoji", e)

# --- combining marks, normalization ---------------------------------------------------------
NFC = [
    "Cafe\u0301",                          # e + combining acute -> é under NFC
    "A\u030Angstro\u0308m",               # A + ring, o + diaeresis
    "\u212Bngstr\u00F6m and \u2126hm",     # Angstrom sign, Ohm sign: singletons
    "\u1100\u1161\u11A8 \u1112\u1161\u11AB\u1100\u1173\u11AF",  # conjoining jamo -> 각 한글
    "a\u0323\u0302 vs a\u0302\u0323",      # marks in both orders (canonical reordering)
    "e\u0301\u0301\u0301 stacked",
    "Z\u0351\u0358a\u0300\u0301l\u0327g\u0304o\u0308 text",
    "\u0915\u093C\u0916\u093C (nukta: excluded from composition)",
    "n\u0303o\u0308 ı\u0307 i\u0307",
    "\u0301 starts with a mark",
    "ends with a mark e\u0301",
    "Ǆ ǅ ǆ ﬁ ﬂ ﬀ (compatibility characters stay under NFC)",
    "Tiếng Việt: Nguye\u0302\u0303n",  # decomposed Vietnamese
    "\u00C5 vs A\u030A vs \u212B",
    "x\u0304\u0305\u0306\u0307\u0308\u0309\u030A\u030B\u030C",
]
for s in NFC:
    add("nfc", s)

# --- whitespace ----------------------------------------------------------------------------
for n in [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 64]:
    add("spaces", " " * n)
    add("spaces", "a" + " " * n + "b")
for s in ["\t", "\t\t", "\t\t\t\t", "\n", "\n\n", "\n\n\n", "\n" * 10, "\r\n", "\r\n\r\n", "\r", " \n", "\n ",
          " \n \n ", "\t\n\t\n", "a \nb", "a  \n  b", "a\t \t b", "x\n\n\n\ny", "  \n\n  x  \n\n  ",
          "word\u00A0nbsp\u00A0word", "ideographic\u3000space", "thin\u2009space\u2002en\u2003em",
          "line\u2028separator\u2029paragraph", "zero\u200Bwidth\u200Bspace", "joiner\u200Dnon\u200Cjoiner",
          " ", "  x", "x  ", "\t x", "x \t", "\v\f vertical tab and form feed \f\v"]:
    add("whitespace", s)

# --- numbers -------------------------------------------------------------------------------
for n in range(1, 26):
    add("digits", "".join(str((i * 7 + 3) % 10) for i in range(n)))
for s in ["3.14159265358979", "1,000,000", "1 000 000", "-42", "+7", "2024-01-15T10:30:00Z", "0x1F2E3D",
          "0b101010", "1e-10", "6.022e23", "v1.2.3-beta.4", "abc123def456", "123abc", "a1b2c3d4e5",
          "99 bottles", "Call 555-0123 or (555) 012-3456", "IPv4 192.168.0.1:8080", "12:34:56.789",
          "$1,234.56", "50%", "1/2 + 3/4 = 5/4", "10^9+7", "007", "0000000000"]:
    add("numbers", s)
add("numbers", "".join(str(i % 10) for i in range(300)))

# --- contractions --------------------------------------------------------------------------
for s in ["don't", "DON'T", "Don'T", "I'm", "I'M", "you're", "YOU'RE", "we've", "WE'VE", "he'll", "HE'LL",
          "she'd", "SHE'D", "it's", "IT'S", "It'S", "'s", "'S", "'t", "'re", "'ve", "'m", "'ll", "'d", "''s",
          "'''", "' s", "rock'n'roll", "don’t (curly)", "it’s", "o'clock'", "'tis", "'twas", "James's", "1980's",
          "x's y't z're", "'sss", "'LLama", "'dd", "'D'S'T", "can't won't shouldn't"]:
    add("contractions", s)

# --- special tokens inside text --------------------------------------------------------------
SPECIAL = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\nHi there.<|im_end|>\n",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "<|endoftext|><|endoftext|>",
    " <|im_end|> ",
    "<|im_start|",
    "<|im_start",
    "<|im_end|>|>",
    "<<|im_end|>>",
    "<think>\nreasoning here\n</think>\n\nThe answer is 42.",
    "<think></think>",
    "text<think>inside</think>text",
    "<|begin_of_text|>Hello",
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|eot_id|><|eot_id|>",
    "<|reserved_special_token_5|> and <|reserved_special_token_250|>",
    "<|reserved_special_token_251|>",
    "<|end_of_text|> <|endoftext|> <|im_end|> <|eot_id|>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "< |im_end| >",
    "<|IM_END|>",
    "Hello   <|im_end|>   world",
    "a\n\n<|endoftext|>\n\nb",
    "<think>   \n reasoning</think>",
    "  <|im_end|>",
    "<|im_end|>\t\t",
    "x \u00A0<|im_end|>\u3000 y",
    "<|im_end|> <|im_end|>  <|im_end|>",
    "word<|endoftext|> word <|endoftext|>word",
    # Gemma 3's: the turn markers, <bos>/<eos>, byte tokens spelled out, unused and HTML tokens,
    # runs of spaces, tabs and newlines (added tokens there), the space marker itself.
    "<bos><start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\nHi there.<end_of_turn>\n",
    "<eos><pad><unk><mask> [multimodal]",
    "literal <0x41> and <0x0a> and <0xFF><0xE4>",
    "<unused0><unused98> <unused99>",
    "<table><tr><td>1</td></tr></table> <h1>Title</h1>",
    "a  b   c    d\t\te\n\n\nf \n \n\n g",
    "<start_of_image><image_soft_token><end_of_image>",
    "<start_of_turn <end_of_turn> <start_of_turn>",
    "\u2581\u2581 literal \u2581 marks \u2581\u2581\u2581x",
]
for s in SPECIAL:
    add("special", s)

# --- long words ----------------------------------------------------------------------------
rng = random.Random(16)
add("long", "a" * 1000)
add("long", "ab" * 700)
add("long", "supercalifragilisticexpialidocious" * 20)
add("long", "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3000)))
add("long", "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(2000)))
add("long", "https://example.com/" + "/".join("segment%d" % i for i in range(200)))
add("long", "!" * 500 + "?" * 500)
add("long", " " * 3000 + "x")
add("long", "\n" * 1000)
add("long", "汉字" * 800)
add("long", "Pneumonoultramicroscopicsilicovolcanoconiosis Hippopotomonstrosesquippedaliophobia")
add("long", "-" * 200 + "=" * 200 + "_" * 200)
add("long", "deadbeef" * 250)
# Adversarial runs (one pre-tokenizer word of thousands of bytes: the linear-time merge path,
# and NFC's reordering of long runs of combining marks).
_adv = random.Random(30)
add("long", "a" * 5000)
add("long", "".join(_adv.choice("ab") for _ in range(3000)))
add("long", "".join(_adv.choice("abcde") for _ in range(3000)))
add("long", "e" + "\u0301\u0316" * 300)
add("long", "\U0001F600\U0001F389" * 300)
add("long", "!?" * 1000)
add("long", "1234567890" * 300)
add("long", " " * 3000 + "x")
add("long", "\u4e00\u4e8c\u4e09" * 500)
# Words whose merge state passes 1 MiB (the merge's large-buffer allocations).
add("long", "a" * 60000)
add("long", "\u4e00\u4e8c" * 12000)

# --- random mixtures -------------------------------------------------------------------------
POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " \t\n\r",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "的一是不了人我在有他这中大来上个国到说们为子和你地出道也时年",
    "あいうえおかきくけこアイウエオ",
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюя",
    "αβγδεζηθικλμνξοπρστυφχψω",
    "\u0300\u0301\u0302\u0303\u0308\u0327",
    "😀🚀👍🏽❤️🇯🇵",
    "éèêëàâäôöûüçñ",
    "\u00A0\u3000\u2009",
    "'sStTrReEvVmMlLdD",
]
for i in range(120):
    n = rng.randint(1, 80)
    weights = [rng.random() for _ in POOLS]
    s = "".join(rng.choice(rng.choices(POOLS, weights)[0]) for _ in range(n))
    add("random", s)

for entry in lines:
    json.dump(entry, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")

# --- not UTF-8: the byte offset where it stops being UTF-8 -----------------------------------
INVALID = [
    ("61626380", 3),          # lone continuation byte
    ("ff", 0),                 # never valid
    ("fe", 0),
    ("616263c3", 3),           # truncated 2-byte sequence at the end
    ("e282", 0),               # truncated 3-byte sequence
    ("f09f98", 0),             # truncated 4-byte sequence
    ("c0af", 0),               # overlong '/'
    ("e080af", 0),             # overlong, 3 bytes
    ("eda080", 0),             # surrogate U+D800
    ("f4908080", 0),           # above U+10FFFF
    ("f8888080", 0),           # 5-byte form
    ("68656c6c6fc328", 5),     # lead byte followed by ASCII
    ("e4bda0e5a5bdff", 6),     # valid CJK then 0xFF
    ("3c7c696d5f656e647c3ec3", 10),  # a special token then a truncated sequence
]
for hexed, at in INVALID:
    json.dump({"kind": "invalid", "hex": hexed, "at": at}, sys.stdout)
    sys.stdout.write("\n")

# --- decoding bytes that are not UTF-8 ---------------------------------------------------------
DECODE = ["f09f98", "f09f9880", "e282ac", "e282", "e282e282ac", "ff", "fffe", "c3", "c328", "80", "8080",
          "e080af", "eda080", "f4908080", "61ff62", "f09f98f09f9880", "c0af", "e4bd", "e4bda0", "f09f"]
for hexed in DECODE:
    json.dump({"kind": "decode", "hex": hexed}, sys.stdout)
    sys.stdout.write("\n")
