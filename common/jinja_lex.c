/* Jinja engine: preprocessing and tokenizing, as @huggingface/jinja does it
 * with trim_blocks and lstrip_blocks on (what transformers' apply_chat_template
 * uses).  Every output byte keeps the offset of the template byte it came
 * from, so errors can name the line and column of the original text. */
#include <string.h>

#include "common/jinja_int.h"
#include "common/unicode.h"

typedef struct pbuf {
    char *s;
    size_t *m; /* original offset of each byte; m[n] = end */
    size_t n;
} pbuf;

static void pb_init(jz_ctx *c, pbuf *p, size_t cap)
{
    p->s = jz_alloc(c, cap + 1);
    p->m = jz_alloc(c, (cap + 1) * sizeof(size_t));
    p->n = 0;
}

static void pb_put(pbuf *p, const pbuf *from, size_t i)
{
    p->s[p->n] = from->s[i];
    p->m[p->n] = from->m[i];
    p->n++;
}

static void pb_end(pbuf *p, const pbuf *from)
{
    p->m[p->n] = from->m[from->n];
    p->s[p->n] = '\0';
}

static bool line_start(const pbuf *p, size_t i)
{
    if (i == 0)
        return true;
    char ch = p->s[i - 1];
    if (ch == '\n' || ch == '\r')
        return true;
    /* U+2028 / U+2029 end lines for a JavaScript multiline ^ */
    return i >= 3 && (unsigned char)p->s[i - 3] == 0xe2 && (unsigned char)p->s[i - 2] == 0x80 &&
           ((unsigned char)p->s[i - 1] == 0xa8 || (unsigned char)p->s[i - 1] == 0xa9);
}

static bool is_word(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_';
}

static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* Matches {%-?\s*(end)?generation\s*-?%} at i; returns its end or 0. */
static size_t match_generation(const pbuf *p, size_t i, bool *lstrip, bool *rstrip)
{
    const char *s = p->s;
    size_t n = p->n;
    if (i + 2 > n || s[i] != '{' || s[i + 1] != '%')
        return 0;
    size_t j = i + 2;
    *lstrip = false;
    if (j < n && s[j] == '-') {
        *lstrip = true;
        j++;
    }
    size_t w;
    while ((w = jz_ws_at(s + j, n - j)) > 0)
        j += w;
    if (n - j >= 3 && memcmp(s + j, "end", 3) == 0 && n - j >= 13 &&
        memcmp(s + j + 3, "generation", 10) == 0)
        j += 13;
    else if (n - j >= 10 && memcmp(s + j, "generation", 10) == 0)
        j += 10;
    else
        return 0;
    while ((w = jz_ws_at(s + j, n - j)) > 0)
        j += w;
    *rstrip = false;
    if (j < n && s[j] == '-') {
        *rstrip = true;
        j++;
    }
    if (n - j >= 2 && s[j] == '%' && s[j + 1] == '}')
        return j + 2;
    return 0;
}

static void preprocess(jz_ctx *c, const char *src, size_t len, pbuf *out)
{
    pbuf a;
    pb_init(c, &a, len);
    for (size_t i = 0; i < len; i++) {
        a.s[i] = src[i];
        a.m[i] = i;
    }
    a.n = len;
    a.m[len] = len;
    /* one trailing newline goes */
    if (a.n && a.s[a.n - 1] == '\n')
        a.n--;
    a.m[a.n] = a.n;

    /* lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1" */
    pbuf b;
    pb_init(c, &b, a.n);
    for (size_t i = 0; i < a.n;) {
        if (line_start(&a, i)) {
            size_t j = i;
            while (j < a.n && (a.s[j] == ' ' || a.s[j] == '\t'))
                j++;
            if (j + 1 < a.n && a.s[j] == '{' &&
                (a.s[j + 1] == '#' || a.s[j + 1] == '%' || a.s[j + 1] == '-')) {
                pb_put(&b, &a, j);
                pb_put(&b, &a, j + 1);
                i = j + 2;
                continue;
            }
        }
        pb_put(&b, &a, i);
        i++;
    }
    pb_end(&b, &a);

    /* trim_blocks: /([#%-]})\n/g -> "$1" */
    pbuf d;
    pb_init(c, &d, b.n);
    for (size_t i = 0; i < b.n;) {
        if (i + 2 < b.n && (b.s[i] == '#' || b.s[i] == '%' || b.s[i] == '-') &&
            b.s[i + 1] == '}' && b.s[i + 2] == '\n') {
            pb_put(&d, &b, i);
            pb_put(&d, &b, i + 1);
            i += 3;
            continue;
        }
        pb_put(&d, &b, i);
        i++;
    }
    pb_end(&d, &b);

    /* generation tags: /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs
     * -> (lstrip ? "" : before) + (rstrip ? "" : after) */
    pb_init(c, out, d.n);
    size_t last_end = 0; /* a match's leading spaces cannot reach into the previous one */
    for (size_t i = 0; i < d.n;) {
        bool ls, rs;
        size_t e = match_generation(&d, i, &ls, &rs);
        if (!e) {
            pb_put(out, &d, i);
            i++;
            continue;
        }
        /* the leading whitespace run is already in out: drop it for {%- */
        if (ls) {
            size_t k = i, w;
            while (k > last_end && (w = jz_ws_before(d.s, k)) > 0 && k - w >= last_end) {
                k -= w;
                out->n -= w;
            }
        }
        size_t j = e, w;
        while ((w = jz_ws_at(d.s + j, d.n - j)) > 0) {
            if (!rs) {
                for (size_t q = 0; q < w; q++)
                    pb_put(out, &d, j + q);
            }
            j += w;
        }
        i = j;
        last_end = j;
    }
    pb_end(out, &d);
}

typedef struct lexer {
    jz_ctx *c;
    pbuf p;
    size_t cur;
    jtok *toks;
    size_t n, cap;
} lexer;

static void push(lexer *L, jtok_type t, size_t start, const char *v, size_t vn)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 64;
        jtok *nt = jz_alloc(L->c, cap * sizeof(jtok));
        if (L->n)
            memcpy(nt, L->toks, L->n * sizeof(jtok));
        L->toks = nt;
        L->cap = cap;
    }
    jtok *t0 = &L->toks[L->n++];
    t0->type = t;
    t0->pos = L->p.m[start];
    t0->val = jz_str(L->c, v, vn);
}

static _Noreturn void lex_fail(lexer *L, const char *msg)
{
    size_t at = L->cur <= L->p.n ? L->p.m[L->cur] : L->p.m[L->p.n];
    jz_fail(L->c, at, "%s", msg);
}

/* The reference's consumeWhile: running off the end is an error. */
static void need_more(lexer *L)
{
    if (L->cur >= L->p.n)
        lex_fail(L, "Unexpected end of input");
}

static void consume_ws(lexer *L)
{
    size_t w;
    while (L->cur < L->p.n && (w = jz_ws_at(L->p.s + L->cur, L->p.n - L->cur)) > 0) {
        L->cur += w;
        need_more(L);
    }
}

static void skip_ws(lexer *L)
{
    size_t w;
    while (L->cur < L->p.n && (w = jz_ws_at(L->p.s + L->cur, L->p.n - L->cur)) > 0)
        L->cur += w;
}

static void strip_trailing(lexer *L)
{
    if (!L->n || L->toks[L->n - 1].type != T_TEXT)
        return;
    jstr *v = L->toks[L->n - 1].val;
    size_t n = v->len, w;
    while ((w = jz_ws_before(v->s, n)) > 0)
        n -= w;
    if (n == 0) {
        L->n--;
        return;
    }
    v->len = n;
    v->s[n] = '\0';
}

static size_t consume_digits(lexer *L)
{
    size_t start = L->cur;
    while (L->cur < L->p.n && is_digit(L->p.s[L->cur])) {
        L->cur++;
        need_more(L);
    }
    return L->cur - start;
}

static void lex_string(lexer *L, char q)
{
    size_t start = L->cur - 1;
    jsb b;
    jsb_init(L->c, &b, 0);
    uint32_t hi = 0; /* pending high surrogate from \uXXXX */
    const char *s = L->p.s;
    for (;;) {
        if (L->cur >= L->p.n)
            lex_fail(L, "Unexpected end of input");
        char ch = s[L->cur];
        if (ch == q)
            break;
        uint32_t unit = 0;
        bool is_unit = false;
        if (ch == '\\') {
            L->cur++;
            need_more(L);
            char e = s[L->cur++];
            if (e == 'x' || e == 'u') {
                int len = e == 'x' ? 2 : 4;
                if (L->p.n - L->cur < (size_t)len)
                    lex_fail(L, "Invalid hexadecimal escape sequence");
                for (int i = 0; i < len; i++) {
                    int h = mr_hex_digit(s[L->cur + (size_t)i]);
                    if (h < 0)
                        lex_fail(L, "Invalid hexadecimal escape sequence");
                    unit = unit * 16 + (uint32_t)h;
                }
                L->cur += (size_t)len;
                is_unit = true;
            } else {
                const char *m = NULL;
                switch (e) {
                case 'n': m = "\n"; break;
                case 't': m = "\t"; break;
                case 'r': m = "\r"; break;
                case 'b': m = "\b"; break;
                case 'f': m = "\f"; break;
                case 'v': m = "\v"; break;
                case '\'': m = "'"; break;
                case '"': m = "\""; break;
                case '\\': m = "\\"; break;
                }
                if (!m) {
                    L->cur--;
                    lex_fail(L, "Unexpected escaped character");
                }
                if (hi) {
                    jsb_adds(L->c, &b, "\xef\xbf\xbd");
                    hi = 0;
                }
                jsb_add(L->c, &b, m, 1);
                continue;
            }
        } else {
            if (hi) {
                jsb_adds(L->c, &b, "\xef\xbf\xbd");
                hi = 0;
            }
            jsb_add(L->c, &b, &s[L->cur], 1);
            L->cur++;
            need_more(L);
            continue;
        }
        if (is_unit) {
            char enc[4];
            if (hi && unit >= 0xdc00 && unit <= 0xdfff) {
                uint32_t cp = 0x10000 + ((hi - 0xd800) << 10) + (unit - 0xdc00);
                jsb_add(L->c, &b, enc, mr_utf8_encode(cp, enc));
                hi = 0;
                continue;
            }
            if (hi) {
                /* divergence: a lone surrogate becomes U+FFFD (UTF-8 has no surrogates) */
                jsb_adds(L->c, &b, "\xef\xbf\xbd");
                hi = 0;
            }
            if (unit >= 0xd800 && unit <= 0xdbff) {
                hi = unit;
            } else if (unit >= 0xdc00 && unit <= 0xdfff) {
                jsb_adds(L->c, &b, "\xef\xbf\xbd");
            } else {
                jsb_add(L->c, &b, enc, mr_utf8_encode(unit, enc));
            }
        }
    }
    if (hi)
        jsb_adds(L->c, &b, "\xef\xbf\xbd");
    push(L, T_STR, start, b.p ? b.p : "", b.len);
    L->cur++; /* closing quote */
}

static const struct {
    const char *seq;
    jtok_type type;
} MAP[] = {
    {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR},
    {"(", T_LPAREN},     {")", T_RPAREN},      {"{", T_LBRACE},     {"}", T_RBRACE},
    {"[", T_LBRACKET},   {"]", T_RBRACKET},    {",", T_COMMA},      {".", T_DOT},
    {":", T_COLON},      {"|", T_PIPE},        {"<=", T_CMP},       {">=", T_CMP},
    {"==", T_CMP},       {"!=", T_CMP},        {"<", T_CMP},        {">", T_CMP},
    {"+", T_ADD},        {"-", T_ADD},         {"~", T_ADD},        {"**", T_POW},
    {"*", T_MUL},        {"//", T_MUL},        {"/", T_MUL},        {"%", T_MUL},
    {"=", T_EQUALS},
};

/* Matches {%-?\s*endraw\s*-?%} at i: returns its end, 0 if none. */
static size_t match_endraw(const lexer *L, size_t i, bool *lstrip, bool *rstrip)
{
    const char *s = L->p.s;
    size_t n = L->p.n, j = i + 2, w;
    if (n - i < 2 || s[i] != '{' || s[i + 1] != '%')
        return 0;
    *lstrip = j < n && s[j] == '-';
    if (*lstrip)
        j++;
    while (j < n && (w = jz_ws_at(s + j, n - j)) > 0)
        j += w;
    if (n - j < 6 || memcmp(s + j, "endraw", 6) != 0)
        return 0;
    j += 6;
    while (j < n && (w = jz_ws_at(s + j, n - j)) > 0)
        j += w;
    *rstrip = j < n && s[j] == '-';
    if (*rstrip)
        j++;
    return (n - j >= 2 && s[j] == '%' && s[j + 1] == '}') ? j + 2 : 0;
}

/* Divergence: {% raw %}...{% endraw %} (jinja2's; the reference has no raw
 * blocks).  Called right after a %}: when it closed {% raw %}, the text up to
 * {% endraw %} becomes one text token. */
static void maybe_raw(lexer *L)
{
    if (L->n < 3 || L->toks[L->n - 3].type != T_OPEN_STMT || L->toks[L->n - 2].type != T_IDENT ||
        strcmp(L->toks[L->n - 2].val->s, "raw") != 0)
        return;
    size_t start = L->cur, i = L->cur, end = 0;
    bool ls = false, rs = false;
    while (i < L->p.n && !(end = match_endraw(L, i, &ls, &rs)))
        i++;
    if (!end)
        lex_fail(L, "unterminated {% raw %} block");
    size_t tpos = L->toks[L->n - 3].pos;
    L->n -= 3;
    size_t e = i;
    if (ls) {
        size_t w;
        while (e > start && (w = jz_ws_before(L->p.s + start, e - start)) > 0)
            e -= w;
    }
    if (e > start)
        push(L, T_TEXT, start, L->p.s + start, e - start);
    /* an empty comment lets text follow, as after any tag */
    push(L, T_COMMENT, i, "", 0);
    L->toks[L->n - 1].pos = tpos;
    L->cur = end;
    if (rs)
        skip_ws(L);
}

void jz_tokenize(jz_ctx *c, const char *src, size_t len, jtok **toks, size_t *ntoks)
{
    lexer L = {.c = c};
    preprocess(c, src, len, &L.p);
    const char *s = L.p.s;
    size_t n = L.p.n;
    int curly = 0;
    while (L.cur < n) {
        jtok_type last = L.n ? L.toks[L.n - 1].type : (jtok_type)-1;
        if (L.n == 0 || last == T_CLOSE_STMT || last == T_CLOSE_EXPR || last == T_COMMENT) {
            size_t start = L.cur;
            while (L.cur < n && !(s[L.cur] == '{' && L.cur + 1 < n &&
                                  (s[L.cur + 1] == '%' || s[L.cur + 1] == '{' ||
                                   s[L.cur + 1] == '#')))
                L.cur++;
            if (L.cur > start) {
                push(&L, T_TEXT, start, s + start, L.cur - start);
                continue;
            }
        }
        if (s[L.cur] == '{' && L.cur + 1 < n && s[L.cur + 1] == '#') {
            size_t start = L.cur;
            L.cur += 2;
            bool before = L.cur < n && s[L.cur] == '-';
            if (before)
                L.cur++;
            size_t cstart = L.cur;
            while (!(L.cur + 1 < n && s[L.cur] == '#' && s[L.cur + 1] == '}')) {
                if (L.cur + 2 >= n)
                    lex_fail(&L, "Missing end of comment tag");
                L.cur++;
            }
            size_t cend = L.cur;
            bool after = cend > cstart && s[cend - 1] == '-';
            if (after)
                cend--;
            if (before)
                strip_trailing(&L);
            push(&L, T_COMMENT, start, s + cstart, cend - cstart);
            L.cur += 2;
            if (after)
                skip_ws(&L);
            continue;
        }
        if (n - L.cur >= 3 && memcmp(s + L.cur, "{%-", 3) == 0) {
            strip_trailing(&L);
            push(&L, T_OPEN_STMT, L.cur, "{%", 2);
            L.cur += 3;
            continue;
        }
        if (n - L.cur >= 3 && memcmp(s + L.cur, "{{-", 3) == 0) {
            strip_trailing(&L);
            push(&L, T_OPEN_EXPR, L.cur, "{{", 2);
            curly = 0;
            L.cur += 3;
            continue;
        }
        consume_ws(&L);
        if (n - L.cur >= 3 && memcmp(s + L.cur, "-%}", 3) == 0) {
            push(&L, T_CLOSE_STMT, L.cur, "%}", 2);
            L.cur += 3;
            skip_ws(&L);
            maybe_raw(&L);
            continue;
        }
        if (n - L.cur >= 3 && memcmp(s + L.cur, "-}}", 3) == 0) {
            push(&L, T_CLOSE_EXPR, L.cur, "}}", 2);
            L.cur += 3;
            skip_ws(&L);
            continue;
        }
        char ch = s[L.cur];
        if (ch == '-' || ch == '+') {
            if (L.n == 0 || last == T_TEXT)
                lex_fail(&L, ch == '-' ? "Unexpected character: -" : "Unexpected character: +");
            if (!(last == T_IDENT || last == T_NUM || last == T_STR || last == T_RPAREN ||
                  last == T_RBRACKET)) {
                size_t start = L.cur;
                L.cur++;
                size_t nd = consume_digits(&L);
                if (nd > 0 && L.cur + 1 < n && s[L.cur] == '.' && is_digit(s[L.cur + 1])) {
                    L.cur++;
                    consume_digits(&L);
                }
                push(&L, nd > 0 ? T_NUM : T_UNARY, start, s + start, L.cur - start);
                continue;
            }
        }
        bool matched = false;
        for (size_t k = 0; k < sizeof MAP / sizeof MAP[0]; k++) {
            if (MAP[k].type == T_CLOSE_EXPR && curly > 0)
                continue;
            size_t sl = strlen(MAP[k].seq);
            if (n - L.cur >= sl && memcmp(s + L.cur, MAP[k].seq, sl) == 0) {
                push(&L, MAP[k].type, L.cur, MAP[k].seq, sl);
                if (MAP[k].type == T_OPEN_EXPR)
                    curly = 0;
                else if (MAP[k].type == T_LBRACE)
                    curly++;
                else if (MAP[k].type == T_RBRACE)
                    curly--;
                L.cur += sl;
                matched = true;
                if (MAP[k].type == T_CLOSE_STMT)
                    maybe_raw(&L);
                break;
            }
        }
        if (matched)
            continue;
        if (ch == '\'' || ch == '"') {
            L.cur++;
            lex_string(&L, ch);
            continue;
        }
        if (is_digit(ch)) {
            size_t start = L.cur;
            consume_digits(&L);
            if (!(L.n && L.toks[L.n - 1].type == T_DOT) && L.cur + 1 < n && s[L.cur] == '.' &&
                is_digit(s[L.cur + 1])) {
                L.cur++;
                consume_digits(&L);
            }
            push(&L, T_NUM, start, s + start, L.cur - start);
            continue;
        }
        if (is_word(ch)) {
            size_t start = L.cur;
            while (L.cur < n && is_word(s[L.cur])) {
                L.cur++;
                need_more(&L);
            }
            push(&L, T_IDENT, start, s + start, L.cur - start);
            continue;
        }
        lex_fail(&L, "Unexpected character");
    }
    *toks = L.toks;
    *ntoks = L.n;
}
