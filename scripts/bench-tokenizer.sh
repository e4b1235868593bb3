#!/bin/bash
# Tokenizer benchmark (not a test): encode throughput on ~10 MB of mixed text
# with the Qwen3 vocabulary, ours and @lenml/tokenizers (a JavaScript port of
# the Hugging Face tokenizers) side by side on the same text, N runs each;
# prints the median MB/s of both and checks that both give the same ids.
#   scripts/bench-tokenizer.sh [BUILD] [FIXTURES] [N]
set -euo pipefail
BUILD=${1:-build}
FIXTURES=${2:-../shared/fixtures}
N=${3:-5}
VOCAB="$FIXTURES/vocab/qwen3-vocab.gguf"
TEXT="$BUILD/bench-tokenizer.txt"
[ -x "$BUILD/bin/tokenize" ] || make -s -j2 "$BUILD/bin/tokenize"
[ -d tests/node/node_modules/@lenml/tokenizers ] ||
    (cd tests/node && npm install --no-audit --no-fund --silent)

# The text: every upstream tokenizer test string of the fixtures (code,
# whitespace runs, emoji, CJK, ...) and the paragraphs below, repeated in a
# rotating order until 10 MB.  Deterministic: same bytes on every run.
mkdir -p "$BUILD"
gen_text() {
    local parts=() f
    for f in "$FIXTURES"/vocab/*.inp; do parts+=("$f"); done
    cat > "$BUILD/bench-multilingual.txt" <<'TXT'
The quick brown fox jumps over the lazy dog. It's 3:45 p.m. and we've spent $1,234.56 on 78 items (≈ 15.8 each).
Le cœur a ses raisons que la raison ne connaît point. Ça coûte 12,50 € — n'est-ce pas ?
Der Straßenverkehr in München ist während der Wiesn besonders dicht; Größe und Übermaß zählen.
El niño comió paella en Valencia mientras llovía; ¿quién sabía que mañana sería festivo?
Москва — столица России, а Санкт-Петербург был столицей до 1918 года.
Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.
人工智能正在改变世界，大型语言模型可以生成文本、翻译语言并回答问题。
東京は日本の首都であり、世界で最も人口の多い都市圏の一つです。ひらがなとカタカナも使います。
서울은 대한민국의 수도이며, 한강이 도시를 가로질러 흐릅니다.
العربية لغة جميلة، ويتحدث بها أكثر من ٤٠٠ مليون شخص حول العالم.
हिन्दी भारत की राजभाषा है और देवनागरी लिपि में लिखी जाती है।
ภาษาไทยเป็นภาษาที่มีวรรณยุกต์ และไม่มีการเว้นวรรคระหว่างคำ
Tiếng Việt có sáu thanh điệu: ngang, huyền, sắc, hỏi, ngã, nặng.
def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

for (size_t i = 0; i < n; i++) { sum += x[i] * y[i]; }  // dot product
{"model": "qwen3", "messages": [{"role": "user", "content": "Hello! 👋🏽 How are you? 🤖"}], "temperature": 0.7}
<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
Summarise the report in three bullet points.<|im_end|>
<|im_start|>assistant
<think>

</think>

TXT
    parts+=("$BUILD/bench-multilingual.txt")
    local k=0 size=0 n=${#parts[@]}
    : > "$TEXT"
    while [ "$size" -lt 10000000 ]; do
        for ((j = 0; j < n; j++)); do
            # strip the test-file separators; keep the strings
            grep -v '^__ggml_vocab_test__$' "${parts[$(((j + k) % n))]}" >> "$TEXT"
        done
        k=$((k + 1))
        size=$(stat -c %s "$TEXT")
    done
}
gen_text
BYTES=$(stat -c %s "$TEXT")

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

echo "text: $TEXT, $BYTES bytes; vocabulary: $VOCAB; $N runs each"
ours=$("$BUILD/bin/tokenize" --model "$VOCAB" --file "$TEXT" --time "$N")
echo "$ours" | sed 's/^/  memra: /'
theirs=$(node tests/node/bench-tokenizer.mjs "$VOCAB" "$TEXT" "$N" "$BUILD/bench-ids-lenml.txt")
echo "$theirs" | sed 's/^/  lenml: /'

"$BUILD/bin/tokenize" --model "$VOCAB" --file "$TEXT" | tr ' ' '\n' > "$BUILD/bench-ids-memra.txt"
if cmp -s "$BUILD/bench-ids-memra.txt" "$BUILD/bench-ids-lenml.txt"; then
    same="identical ids ($(wc -l < "$BUILD/bench-ids-memra.txt") tokens)"
else
    same="DIFFERENT ids"
fi
m_ours=$(echo "$ours" | awk '{print $(NF-1)}' | median)
m_theirs=$(echo "$theirs" | awk '{print $(NF-1)}' | median)
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
echo
echo "| date | machine | text | N | memra median MB/s | @lenml/tokenizers median MB/s | ids |"
echo "|---|---|---|---|---|---|---|"
echo "| $(date -u +%Y-%m-%d) | ${cpu:-unknown CPU}, 1 thread | $BYTES B mixed | $N | $m_ours | $m_theirs | $same |"
[ "$same" != "DIFFERENT ids" ]
