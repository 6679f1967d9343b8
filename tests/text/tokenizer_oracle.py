"""The oracle of tests/text/tokenizer_oracle_test.cpp: Hugging Face
`tokenizers` (for a tokenizer.json) and transformers' tokenizer built from a
GGUF file (`AutoTokenizer.from_pretrained(dir, gguf_file=)`) encode and
decode a corpus of several thousand strings.

The corpus (`corpus()`, deterministic) holds the shared goldens' texts,
multilingual sentences, emoji (ZWJ sequences, skin tones, flags),
whitespace runs, numbers, code, special tokens written in text, random
Unicode drawn from many blocks, and random splices of all of those.

Usage:
  tokenizer_oracle.py json TOKENIZER.json OUT.json
  tokenizer_oracle.py gguf DIR GGUF_NAME OUT.json
  tokenizer_oracle.py write-llama-gguf TOKENIZER.json OUT.gguf
Writes OUT.json: {"texts": [...], "ids": [[...]] (add_special_tokens=False),
"ids_special": [[...]] (add_special_tokens=True), "decoded": [...] (the ids
decoded with skip_special_tokens=False)}; for a GGUF also "adjustment" and
"texts_the_adjustment_changed" (see llama_cpp_pre_tokenization).

`write-llama-gguf` turns a SentencePiece-style BPE tokenizer.json (Llama 2's)
into the `tokenizer.ggml.*` keys llama.cpp's converter writes for it
(convert_hf_to_gguf.py `_set_vocab_sentencepiece`): model `llama`, the
pieces in id order, scores that rank the normal pieces as the file's merges
do (a piece's score is minus the rank of the first merge that makes it, as
SentencePiece's scores order its merges; pieces no merge makes rank after
all merges; 0 for specials and bytes), token types
(UNKNOWN 2, CONTROL 3, BYTE 6, NORMAL 1), BOS / EOS / UNK ids and
add_bos_token, and no merges: a `llama` vocabulary has none, so both
readers rebuild them from the scores.
"""
import json
import os
import random
import sys

SHARED = os.environ.get("SHARDLINE_SHARED_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared")

MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog.",
    "Ich habe gestern Abend mit meinen Freunden Fußball geschaut, und Müller hat zwei Tore geschossen.",
    "L'été dernier, nous sommes allés à Montréal ; c'était très agréable — vraiment !",
    "¿Dónde está la biblioteca? ¡Necesito estudiar para el examen de mañana!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Τα μαθηματικά είναι η γλώσσα με την οποία ο Θεός έγραψε το σύμπαν.",
    "الذكاء الاصطناعي يغير طريقة عملنا وتعلمنا كل يوم.",
    "שלום עולם, זהו מבחן של טקסט בעברית עם ניקוד: בְּרֵאשִׁית.",
    "भारत एक विशाल देश है जिसमें अनेक भाषाएँ बोली जाती हैं।",
    "আমি বাংলায় গান গাই, আমি বাংলার গান গাই।",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ ซึ่งทำให้การตัดคำยากมาก",
    "我们今天下午三点在会议室开会，请准时参加。",
    "機械学習モデルの推論を高速化するために、バッチ処理を使います。カタカナ、ひらがな。",
    "한국어 문장은 띄어쓰기를 사용합니다. 안녕하세요, 반갑습니다!",
    "Tiếng Việt có nhiều dấu thanh: à, á, ả, ã, ạ, ằ, ắ, ẳ, ẵ, ặ.",
    "İstanbul'da yaşayan Ağrılı öğrenciler çok çalışkan.",
    "Zażółć gęślą jaźń, pchnąć w tę łódź jeża lub ośm skrzyń fig.",
    "მე მიყვარს ქართული ენა და ანბანი.",
    "Բարեւ ձեզ, ինչպե՞ս եք։",
    "ሰላም ለዓለም፣ ይህ የአማርኛ ጽሑፍ ነው።",
    "தமிழ் ஒரு பழமையான மொழி ஆகும்.",
    "Þetta er íslenskur texti með ð og þ.",
    "Kiswahili ni lugha ya Kibantu inayozungumzwa Afrika Mashariki.",
    "Ελληνικά και English mixed με 中文 and 日本語 in one line.",
    "naïve café résumé coöperate façade jalapeño Ångström",
    "ﬁﬂ ligatures, fullwidth ＡＢＣ１２３, circled ①②③, superscript x² and ½ ⅓.",
    "Mathematical: ∀x ∈ ℝ, ∃y : x² + y² ≤ 1 ⇒ |x| ≤ 1; ∑ᵢ aᵢ = ∫ f(t) dt.",
    "Currency: $1,234.56, €99, £5, ¥1000, ₹250, ₿0.001",
    "Combining marks: e\u0301 a\u0308 o\u0302\u0323 n\u0303 and Hangul jamo \u1100\u1161\u11a8.",
]

EMOJI = [
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵🇺🇸🇩🇪", "❤️", "🤖 + 🧠 = 🚀", "I ❤️ NY 🗽!",
    "👩🏾‍💻 writes code", "🙏🙏🙏", "🎉🎊✨", "🐍 Python and 🦀 Rust", "⌚⌛⏰", "🫠🫡🫥",
]

WHITESPACE = [
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n ", "\t\t\tx", "x\t\t\t",
    "    indented", "trailing    ", "a  b   c    d", "line1\nline2\n\nline4", " leading space",
    "\u00a0nbsp\u00a0", "ideographic\u3000space", "zero\u200bwidth", "mixed \t\n\r\x0b\x0c end",
    "\n\n\n\n\n\n\n\n", " " * 17, "\t \t \t", "x\r\ny\rz\n",
]

CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "<html><body><p class=\"x\">Hello &amp; welcome</p></body></html>",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "const add = (a, b) => a + b; console.log(add(2, 3));",
    "$ git commit -m 'fix: off-by-one' && git push origin main",
    "https://example.com/path?query=1&other=two#fragment",
    "user@example.org, +1 (555) 123-4567",
    "C:\\Users\\name\\Documents\\file.txt",
    "x = [i*i for i in range(10) if i % 2 == 0]",
    "#include <vector>\nstd::vector<int> v{1, 2, 3};",
]

CONTRACTIONS = [
    "I'm sure you'll see they've done it; she'd say it's what we'll do.",
    "DON'T SHOUT, IT'S LOUD. WE'VE HEARD. YOU'LL SEE. HE'D KNOW.",
    "rock 'n' roll, 'quoted', ''double'', '''triple'''",
    "Hello!!! What??? Yes... No—maybe; (perhaps) [sure] {ok} <fine>",
]

NUMBERS = [
    "0", "7", "42", "123", "1234", "12345", "123456789", "3.14159", "-2.5e10", "1,000,000",
    "2026-11-29", "12:34:56", "v1.2.3", "0x1F", "1st 2nd 3rd 4th", "98.6°F", "100%",
    "๑๒๓ ١٢٣ १२३ 一二三", "Ⅳ Ⅻ", "12 345 678",
]

SPECIALS = [
    "<|im_start|>user\nHi<|im_end|>\n", "<s>Hello</s>", "text <s> in </s> the middle", "<unk>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|endoftext|>", "<|im_start|>", "<think>reasoning</think>", "< s >", "<<s>>", "<|im_end|>x<|im_end|>",
]

# Code point ranges random Unicode is drawn from (no surrogates).
RANGES = [
    (0x20, 0x7E), (0x09, 0x0D), (0xA0, 0xFF), (0x100, 0x24F), (0x300, 0x36F), (0x370, 0x3FF),
    (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
    (0x2000, 0x206F), (0x20A0, 0x20CF), (0x2190, 0x22FF), (0x2460, 0x24FF), (0x2500, 0x27BF),
    (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xE0FF), (0xF900, 0xFAFF),
    (0xFB00, 0xFB4F), (0xFE00, 0xFE0F), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x1D400, 0x1D7FF),
    (0x10000, 0x1007F), (0x20000, 0x2A6DF), (0xE0000, 0xE007F),
]


def golden_texts():
    out = []
    for name in ("llama2", "llama3_1", "qwen3"):
        path = os.path.join(SHARED, "tokenizers", name, "encode_golden.json")
        if os.path.exists(path):
            doc = json.load(open(path, encoding="utf-8"))
            out += [c["text"] for c in (doc["cases"] if isinstance(doc, dict) else doc)]
        path = os.path.join(SHARED, "tokenizers", name, "chat_template_golden.json")
        if os.path.exists(path):
            doc = json.load(open(path, encoding="utf-8"))
            for case in doc.get("cases", []):
                if isinstance(case.get("text"), str):
                    out.append(case["text"])
    return out


def random_unicode(rng, n):
    s = []
    for _ in range(n):
        lo, hi = rng.choice(RANGES)
        s.append(chr(rng.randint(lo, hi)))
    return "".join(s)


def corpus():
    rng = random.Random(20261129)
    base = golden_texts() + MULTILINGUAL + EMOJI + WHITESPACE + CODE + CONTRACTIONS + NUMBERS + SPECIALS
    texts = list(base)
    # Every base text with a leading space, a trailing newline, upper-cased.
    for t in base:
        texts += [" " + t, t + "\n", t.upper()]
    # Words of the base texts, alone and with a leading space.
    words = sorted({w for t in base for w in t.split()})
    texts += words + [" " + w for w in words]
    # Random Unicode strings, lengths 1..40.
    texts += [random_unicode(rng, rng.randint(1, 40)) for _ in range(1200)]
    # Random splices of base texts, words, emoji, whitespace and random Unicode.
    pool = base + words + [random_unicode(rng, 3) for _ in range(100)]
    for _ in range(1200):
        parts = [rng.choice(pool) for _ in range(rng.randint(2, 5))]
        seps = ["", " ", "\n", "  ", "\t", ""]
        texts.append("".join(p + rng.choice(seps) for p in parts))
    # Digit runs of every length 1..24 with and without a leading space and letters.
    for n in range(1, 25):
        d = "".join(str(rng.randint(0, 9)) for _ in range(n))
        texts += [d, " " + d, "x" + d + "y", d + " apples"]
    texts.append("")
    # Deduplicate, keeping order.
    seen, out = set(), []
    for t in texts:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def write_result(out_path, encode, decode):
    texts = corpus()
    ids = [encode(t, False) for t in texts]
    ids_special = [encode(t, True) for t in texts]
    decoded = [decode(i) for i in ids]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"texts": texts, "ids": ids, "ids_special": ids_special, "decoded": decoded}, f, ensure_ascii=True)


def from_json(path, out_path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)
    write_result(out_path, lambda t, special: tok.encode(t, add_special_tokens=special).ids,
                 lambda ids: tok.decode(ids, skip_special_tokens=False))


def llama_cpp_pre_tokenization(tok, model_dir, gguf_name):
    """Where transformers' GGUF tokenizer splits text otherwise than
    llama.cpp, puts llama.cpp's splitting in its place and says what it did
    (None when nothing changed). Two known cases:
      - `gpt2` with a `tokenizer.ggml.pre` transformers has no regex for
        (e.g. SmolLM2's "smollm"): llama.cpp splits digits off first
        (llama-vocab.cpp: "\\p{N}", then GPT-2's regex), as the model's own
        tokenizer.json does; transformers keeps GPT-2's regex alone.
      - `llama` with add_space_prefix: llama.cpp (and SentencePiece's
        add_dummy_prefix) put a space before every run of text; transformers'
        Metaspace(prepend_scheme="first") skips it when the text already
        starts with one ("  x": llama.cpp "▁▁▁x", transformers "▁▁x").
    """
    from tokenizers import Regex, normalizers, pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    from gguf import GGUFReader
    reader = GGUFReader(os.path.join(model_dir, gguf_name))

    def field(key, default=None):
        f = reader.get_field(key)
        return default if f is None else f.contents()

    backend = tok.backend_tokenizer
    model = field("tokenizer.ggml.model")
    pre = field("tokenizer.ggml.pre", "default")
    if model == "gpt2" and pre in ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva") \
            and pre not in GGUF_PRE_TOKENIZER_SPLITS:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        return "pre-tokenizer '%s': digits split off before GPT-2's regex, as llama.cpp does" % pre
    if model == "llama" and field("tokenizer.ggml.add_space_prefix", True):
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        backend.pre_tokenizer = None
        return "llama vocabulary: a U+2581 before every run of text, as llama.cpp's add_space_prefix puts it"
    return None


def from_gguf(model_dir, gguf_name, out_path):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf_name)
    texts = corpus()
    as_built = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    adjustment = llama_cpp_pre_tokenization(tok, model_dir, gguf_name)
    write_result(out_path, lambda t, special: tok(t, add_special_tokens=special)["input_ids"],
                 lambda ids: tok.decode(ids, skip_special_tokens=False))
    doc = json.load(open(out_path, encoding="utf-8"))
    doc["adjustment"] = adjustment
    doc["texts_the_adjustment_changed"] = sum(a != b for a, b in zip(as_built, doc["ids"]))
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=True)


def write_llama_gguf(tokenizer_json, out_path):
    import gguf
    doc = json.load(open(tokenizer_json, encoding="utf-8"))
    vocab = doc["model"]["vocab"]
    tokens = [None] * len(vocab)
    for piece, i in vocab.items():
        tokens[i] = piece
    special = {t["content"]: t["id"] for t in doc["added_tokens"]}
    merges = [m.split(" ") if isinstance(m, str) else m for m in doc["model"]["merges"]]
    merge_rank = {}
    for rank, (left, right) in enumerate(merges):
        merge_rank.setdefault(left + right, rank)
    first_normal = max(i for i, t in enumerate(tokens) if t.startswith("<0x") and t.endswith(">")) + 1
    scores, types = [], []
    for i, t in enumerate(tokens):
        if t == doc["model"]["unk_token"]:
            scores.append(0.0), types.append(gguf.TokenType.UNKNOWN)
        elif t in special:
            scores.append(0.0), types.append(gguf.TokenType.CONTROL)
        elif i < first_normal:
            scores.append(0.0), types.append(gguf.TokenType.BYTE)
        else:
            scores.append(-float(merge_rank.get(t, len(merges) + i))), types.append(gguf.TokenType.NORMAL)
    w = gguf.GGUFWriter(out_path, "llama")
    w.add_name("llama2-tokenizer")
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(special["<s>"])
    w.add_eos_token_id(special["</s>"])
    w.add_unk_token_id(vocab[doc["model"]["unk_token"]])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    mode = sys.argv[1]
    if mode == "json":
        from_json(sys.argv[2], sys.argv[3])
    elif mode == "gguf":
        from_gguf(sys.argv[2], sys.argv[3], sys.argv[4])
    elif mode == "write-llama-gguf":
        write_llama_gguf(sys.argv[2], sys.argv[3])
    elif mode == "corpus-size":
        print(len(corpus()))
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main()
