/* Pre-tokenizers: the regexes that upstream tokenizers (Hugging Face
 * tokenizers, llama.cpp) apply before BPE, written as hand matchers over the
 * Unicode class table.  A pre-tokenizer is a list of passes; each pass finds
 * the leftmost matches of one regex inside every segment of the previous
 * pass, and both the matches and the text between them become segments (the
 * way llama.cpp composes its regex lists).  Inside a segment the regex sees
 * the segment's end as the end of input (for (?!\S) and $). */
#include <stdlib.h>
#include <string.h>

#include "common/tok_internal.h"
#include "common/unicode.h"

typedef struct ptx {
    const uint32_t *cp; /* code points */
    const uint8_t *fl;  /* class flags of each code point */
} ptx;

/* Finds the leftmost match in [from, end): start *ms, length *ml > 0. */
typedef bool (*find_fn)(const ptx *x, size_t from, size_t end, int arg, size_t *ms, size_t *ml);

#define CAT(i) (x->fl[i] & MR_UFLAG_CAT)
#define IS_WS(i) ((x->fl[i] & MR_UFLAG_WS) != 0)
#define IS_L(i) (CAT(i) == MR_UCAT_L)
#define IS_N(i) (CAT(i) == MR_UCAT_N)
#define IS_P(i) (CAT(i) == MR_UCAT_P)
#define IS_M(i) (CAT(i) == MR_UCAT_M)

static inline uint32_t ascii_lower(uint32_t c)
{
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d, case-insensitive when ci: length or 0. */
static size_t contraction(const ptx *x, size_t p, size_t end, bool ci)
{
    if (x->cp[p] != '\'' || p + 1 >= end)
        return 0;
    uint32_t a = ci ? ascii_lower(x->cp[p + 1]) : x->cp[p + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (p + 2 >= end)
        return 0;
    uint32_t b = ci ? ascii_lower(x->cp[p + 2]) : x->cp[p + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
 * Every position starts a match (a lone whitespace before a non-space
 * cannot occur: the space would have joined the next word). */
static bool find_gpt2(const ptx *x, size_t p, size_t end, int arg, size_t *ms, size_t *ml)
{
    (void)arg;
    *ms = p;
    size_t k = contraction(x, p, end, false);
    if (k) {
        *ml = k;
        return true;
    }
    size_t q = p;
    if (x->cp[p] == ' ')
        q = p + 1; /* the optional leading space */
    if (q < end && !IS_WS(q)) {
        size_t r = q;
        if (IS_L(q)) {
            while (r < end && IS_L(r))
                r++;
        } else if (IS_N(q)) {
            while (r < end && IS_N(r))
                r++;
        } else {
            while (r < end && !IS_WS(r) && !IS_L(r) && !IS_N(r))
                r++;
        }
        *ml = r - p;
        return true;
    }
    size_t w = p;
    while (w < end && IS_WS(w))
        w++;
    k = w - p;
    if (k > 1 && w < end)
        *ml = k - 1;
    else if (k > 0)
        *ml = k;
    else
        *ml = 1;
    return true;
}

/* llama3 (arg 3), qwen2 (arg 1), qwen35 (arg 1 | 0x100: letters include marks):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}
 * | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static bool find_llama3(const ptx *x, size_t p, size_t end, int arg, size_t *ms, size_t *ml)
{
    const size_t maxd = (size_t)(arg & 0xFF);
    const bool marks = (arg & 0x100) != 0;
#define LETTER(i) (IS_L(i) || (marks && IS_M(i)))
    *ms = p;
    size_t k = contraction(x, p, end, true);
    if (k) {
        *ml = k;
        return true;
    }
    uint32_t c = x->cp[p];
    if (c != '\r' && c != '\n' && !IS_N(p)) {
        if (LETTER(p) || (p + 1 < end && LETTER(p + 1))) {
            size_t r = p + 1;
            while (r < end && LETTER(r))
                r++;
            *ml = r - p;
            return true;
        }
    }
    if (IS_N(p)) {
        size_t r = p;
        while (r < end && IS_N(r) && r - p < maxd)
            r++;
        *ml = r - p;
        return true;
    }
    {
        size_t q = (c == ' ') ? p + 1 : p;
        size_t r = q;
        while (r < end && !IS_WS(r) && !LETTER(r) && !IS_N(r))
            r++;
        if (r > q) {
            while (r < end && (x->cp[r] == '\r' || x->cp[r] == '\n'))
                r++;
            *ml = r - p;
            return true;
        }
    }
    size_t w = p, last_nl = 0;
    while (w < end && IS_WS(w)) {
        if (x->cp[w] == '\r' || x->cp[w] == '\n')
            last_nl = w + 1;
        w++;
    }
    k = w - p;
    if (last_nl)
        *ml = last_nl - p;
    else if (k > 1 && w < end)
        *ml = k - 1;
    else if (k > 0)
        *ml = k;
    else
        *ml = 1;
    return true;
#undef LETTER
}

/* \p{N}{1,arg}; arg 0 means unbounded (\p{N}+) */
static bool find_num(const ptx *x, size_t p, size_t end, int arg, size_t *ms, size_t *ml)
{
    while (p < end && !IS_N(p))
        p++;
    if (p == end)
        return false;
    size_t r = p;
    while (r < end && IS_N(r) && (arg == 0 || r - p < (size_t)arg))
        r++;
    *ms = p;
    *ml = r - p;
    return true;
}

/* [0-9][0-9][0-9] */
static bool find_digit3(const ptx *x, size_t p, size_t end, int arg, size_t *ms, size_t *ml)
{
    (void)arg;
    size_t run = 0;
    for (; p < end; p++) {
        uint32_t c = x->cp[p];
        run = (c >= '0' && c <= '9') ? run + 1 : 0;
        if (run == 3) {
            *ms = p - 2;
            *ml = 3;
            return true;
        }
    }
    return false;
}

/* [\p{P}\$\+<=>\^~\|]+ (arg 1: backtick too, as falcon has it) */
static inline bool punct_sym(const ptx *x, size_t i, int arg)
{
    uint32_t c = x->cp[i];
    return IS_P(i) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
           c == '~' || c == '|' || (arg && c == '`');
}
static bool find_punct_run(const ptx *x, size_t p, size_t end, int arg, size_t *ms, size_t *ml)
{
    while (p < end && !punct_sym(x, p, arg))
        p++;
    if (p == end)
        return false;
    size_t r = p;
    while (r < end && punct_sym(x, r, arg))
        r++;
    *ms = p;
    *ml = r - p;
    return true;
}

/* [\r\n] */
static bool find_newline(const ptx *x, size_t p, size_t end, int arg, size_t *ms, size_t *ml)
{
    (void)arg;
    for (; p < end; p++) {
        if (x->cp[p] == '\r' || x->cp[p] == '\n') {
            *ms = p;
            *ml = 1;
            return true;
        }
    }
    return false;
}

/* deepseek-llm letter class (from its tokenizer.json regex) */
static const uint32_t dsllm_letters[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
    {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377},
    {0x37B, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C},
    {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
    {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
    {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
    {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
    {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC},
    {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
    {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE},
    {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787},
    {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
/* deepseek-llm punctuation class: [!-/:-~！-／：-～‘-‟　-。] */
static const uint32_t dsllm_punct[][2] = {
    {0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F}, {0x3000, 0x3002}, {0xFF01, 0xFF0F},
    {0xFF1A, 0xFF5E},
};
/* [一-龥ࠀ-一가-퟿] = U+0800..U+9FA5 and U+AC00..U+D7FF */
static const uint32_t cjk_ranges[][2] = {{0x0800, 0x9FA5}, {0xAC00, 0xD7FF}};

/* r: sorted, disjoint ranges */
static bool in_ranges(uint32_t c, const uint32_t (*r)[2], size_t n)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r[mid][1] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && c >= r[lo][0];
}

/* Classes of the regexes that upstream runs without \p{..} (std::wregex):
 * there a non-ASCII whitespace character is seen as U+000B, so it never
 * matches a literal range. */
enum { CLS_L, CLS_P, CLS_DSL, CLS_DSP, CLS_CJK };
static inline bool in_cls(const ptx *x, size_t i, int cls)
{
    uint32_t c = x->cp[i];
    switch (cls) {
    case CLS_L:
        return IS_L(i);
    case CLS_P:
        return IS_P(i);
    case CLS_DSL:
        if (c < 0x80)
            return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
        return !IS_WS(i) && in_ranges(c, dsllm_letters, sizeof dsllm_letters / sizeof *dsllm_letters);
    case CLS_DSP:
        if (c < 0x80)
            return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x7E);
        return !IS_WS(i) && in_ranges(c, dsllm_punct, sizeof dsllm_punct / sizeof *dsllm_punct);
    default:
        return c >= 0x800 && !IS_WS(i) && in_ranges(c, cjk_ranges, 2);
    }
}

/* \s?[CLASS]+ (arg = class | 0x100 when the optional \s is absent) */
static bool find_ws_class(const ptx *x, size_t p, size_t end, int arg, size_t *ms, size_t *ml)
{
    const int cls = arg & 0xFF;
    const bool opt_ws = !(arg & 0x100);
    for (; p < end; p++) {
        size_t q;
        if (opt_ws && IS_WS(p) && p + 1 < end && in_cls(x, p + 1, cls))
            q = p + 1;
        else if (in_cls(x, p, cls))
            q = p;
        else
            continue;
        size_t r = q;
        while (r < end && in_cls(x, r, cls))
            r++;
        *ms = p;
        *ml = r - p;
        return true;
    }
    return false;
}

/* \s+$ : the whitespace run that ends the segment */
static bool find_trailing_ws(const ptx *x, size_t p, size_t end, int arg, size_t *ms, size_t *ml)
{
    (void)arg;
    size_t t = end;
    while (t > p && IS_WS(t - 1))
        t--;
    if (t == end)
        return false;
    *ms = t;
    *ml = end - t;
    return true;
}

/* [^\n]+|[\n]+ */
static bool find_lines(const ptx *x, size_t p, size_t end, int arg, size_t *ms, size_t *ml)
{
    (void)arg;
    bool nl = x->cp[p] == '\n';
    size_t r = p + 1;
    while (r < end && (x->cp[r] == '\n') == nl)
        r++;
    *ms = p;
    *ml = r - p;
    return true;
}

typedef struct pass {
    find_fn fn;
    int arg;
} pass;

#define MAX_PASSES 6
typedef struct preset {
    int n;
    pass p[MAX_PASSES];
} preset;

static const preset presets[] = {
    [MR_PRE_NONE] = {0, {{0}}},
    [MR_PRE_DEFAULT] = {4, {{find_punct_run, 0}, {find_gpt2, 0}, {find_num, 0}, {find_digit3, 0}}},
    [MR_PRE_GPT2] = {1, {{find_gpt2, 0}}},
    [MR_PRE_LLAMA3] = {1, {{find_llama3, 3}}},
    [MR_PRE_QWEN2] = {1, {{find_llama3, 1}}},
    [MR_PRE_QWEN35] = {1, {{find_llama3, 1 | 0x100}}},
    [MR_PRE_DEEPSEEK_LLM] = {6, {{find_newline, 0}, {find_ws_class, CLS_DSL}, {find_ws_class, CLS_DSP},
                                 {find_trailing_ws, 0}, {find_ws_class, CLS_CJK | 0x100}, {find_num, 0}}},
    [MR_PRE_DEEPSEEK_CODER] = {5, {{find_newline, 0}, {find_ws_class, CLS_L}, {find_ws_class, CLS_P},
                                   {find_ws_class, CLS_CJK | 0x100}, {find_num, 1}}},
    [MR_PRE_FALCON] = {3, {{find_punct_run, 1}, {find_gpt2, 0}, {find_digit3, 0}}},
    [MR_PRE_STARCODER] = {2, {{find_num, 1}, {find_gpt2, 0}}},
    [MR_PRE_GEMMA4] = {1, {{find_lines, 0}}},
};

static const struct {
    const char *name;
    enum mr_pre pre;
    bool ignore_merges;
} pre_names[] = {
    {"default", MR_PRE_DEFAULT, false},
    {"gpt-2", MR_PRE_GPT2, false},      {"phi-2", MR_PRE_GPT2, false},
    {"mpt", MR_PRE_GPT2, false},        {"olmo", MR_PRE_GPT2, false},
    {"jais", MR_PRE_GPT2, false},       {"trillion", MR_PRE_GPT2, false},
    {"roberta-bpe", MR_PRE_GPT2, false}, {"exaone4", MR_PRE_GPT2, false},
    {"llama3", MR_PRE_LLAMA3, true},    {"llama-v3", MR_PRE_LLAMA3, true},
    {"llama-bpe", MR_PRE_LLAMA3, true}, {"falcon3", MR_PRE_LLAMA3, true},
    {"dbrx", MR_PRE_LLAMA3, false},     {"smaug-bpe", MR_PRE_LLAMA3, false},
    {"chatglm-bpe", MR_PRE_LLAMA3, false}, {"glm4", MR_PRE_LLAMA3, false},
    {"qwen2", MR_PRE_QWEN2, false},     {"deepseek-r1-qwen", MR_PRE_QWEN2, false},
    {"stablelm2", MR_PRE_QWEN2, false}, {"megrez", MR_PRE_QWEN2, false},
    {"hunyuan", MR_PRE_QWEN2, false},
    {"qwen35", MR_PRE_QWEN35, false},
    {"deepseek-llm", MR_PRE_DEEPSEEK_LLM, false},
    {"deepseek-coder", MR_PRE_DEEPSEEK_CODER, false},
    {"falcon", MR_PRE_FALCON, false},
    {"starcoder", MR_PRE_STARCODER, false}, {"refact", MR_PRE_STARCODER, false},
    {"command-r", MR_PRE_STARCODER, false}, {"smollm", MR_PRE_STARCODER, false},
    {"codeshell", MR_PRE_STARCODER, false}, {"exaone", MR_PRE_STARCODER, false},
    {"minerva-7b", MR_PRE_STARCODER, false},
    {"gemma4", MR_PRE_GEMMA4, false},
};

int mr_pre_from_name(const char *name, bool *ignore_merges)
{
    *ignore_merges = false;
    if (!name || !*name)
        return MR_PRE_DEFAULT; /* upstream's fallback for files without the key */
    for (size_t i = 0; i < sizeof pre_names / sizeof *pre_names; i++) {
        if (strcmp(name, pre_names[i].name) == 0) {
            *ignore_merges = pre_names[i].ignore_merges;
            return pre_names[i].pre;
        }
    }
    return -1;
}

/* Splitting is done in chunks so that scratch memory stays small: a chunk
 * ends right after a '\n' that is followed by an ASCII letter, a place where
 * every pre-tokenizer above ends a word, whatever comes around it. */
#define CHUNK_TARGET 16384

static size_t chunk_end(const char *s, size_t len)
{
    if (len <= CHUNK_TARGET)
        return len;
    for (size_t i = CHUNK_TARGET; i + 1 < len; i++) {
        if (s[i] == '\n') {
            char c = s[i + 1];
            if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
                return i + 1;
        }
    }
    return len;
}

int mr_pretok_split(enum mr_pre pre, const char *text, size_t len, mr_word_fn fn, void *ctx,
                    mr_err *err)
{
    const preset *ps = &presets[pre];
    if (ps->n == 0)
        return len ? fn(text, len, ctx) : 0;
    size_t cap = 0;
    uint32_t *cp = NULL, *boff = NULL, *cut_a = NULL, *cut_b = NULL;
    uint8_t *fl = NULL;
    int rc = 0;
    while (len > 0) {
        size_t clen = chunk_end(text, len);
        if (clen > UINT32_MAX - 1) {
            rc = mr_errf(err, "tokenize: text fragment of %zu bytes is too long", clen);
            break;
        }
        if (clen > cap) {
            free(cp), free(boff), free(cut_a), free(cut_b), free(fl);
            cap = clen;
            cp = malloc(cap * sizeof *cp);
            boff = malloc((cap + 1) * sizeof *boff);
            cut_a = malloc((cap + 1) * sizeof *cut_a);
            cut_b = malloc((cap + 1) * sizeof *cut_b);
            fl = malloc(cap);
            if (!cp || !boff || !cut_a || !cut_b || !fl) {
                rc = mr_errf(err, "tokenize: out of memory for %zu bytes", clen);
                break;
            }
        }
        const uint8_t *s = (const uint8_t *)text;
        size_t n = 0;
        for (size_t i = 0; i < clen;) {
            size_t l;
            uint32_t c = mr_utf8_decode(s + i, clen - i, &l);
            cp[n] = c;
            fl[n] = (uint8_t)mr_unicode_flags(c);
            boff[n] = (uint32_t)i;
            n++;
            i += l;
        }
        boff[n] = (uint32_t)clen;
        ptx x = {cp, fl};
        uint32_t *in = cut_a, *out = cut_b;
        size_t nin = 1;
        in[0] = (uint32_t)n;
        for (int k = 0; k < ps->n; k++) {
            size_t nout = 0, start = 0;
            for (size_t j = 0; j < nin; j++) {
                size_t e = in[j], p = start, ms, ml;
                while (p < e && ps->p[k].fn(&x, p, e, ps->p[k].arg, &ms, &ml)) {
                    if (ms > p)
                        out[nout++] = (uint32_t)ms;
                    p = ms + ml;
                    out[nout++] = (uint32_t)p;
                }
                if (p < e)
                    out[nout++] = (uint32_t)e;
                start = e;
            }
            uint32_t *tmp = in;
            in = out;
            out = tmp;
            nin = nout;
        }
        size_t start = 0;
        for (size_t j = 0; j < nin && rc == 0; j++) {
            rc = fn(text + boff[start], boff[in[j]] - boff[start], ctx);
            start = in[j];
        }
        if (rc)
            break;
        text += clen;
        len -= clen;
    }
    free(cp), free(boff), free(cut_a), free(cut_b), free(fl);
    return rc;
}
