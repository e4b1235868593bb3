/* Tokenizer: loading from GGUF, special-token partitioning, encode dispatch
 * and decoding (pieces, whole sequences, streaming). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tok_internal.h"
#include "common/unicode.h"

/* ---- small containers ---- */

void mr_bytes_free(mr_bytes *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int mr_bytes_append(mr_bytes *b, const void *p, size_t n)
{
    if (b->cap - b->len < n + 1) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->len < n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return -1;
        b->data = d;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0'; /* convenient for callers; not counted */
    return 0;
}

void mr_tokens_free(mr_tokens *t)
{
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

int mr_tokens_push(mr_tokens *t, mr_token id)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        mr_token *d = realloc(t->ids, cap * sizeof *d);
        if (!d)
            return -1;
        t->ids = d;
        t->cap = cap;
    }
    t->ids[t->n++] = id;
    return 0;
}

uint64_t mr_tok_hash(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    if (n)
        memcpy(&v, s, n);
    h = (h ^ v) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

/* ---- lookups ---- */

mr_token mr_tok_find(const mr_tokenizer *t, const char *text, size_t len)
{
    uint64_t i = mr_tok_hash(text, len) & t->slot_mask;
    for (;;) {
        uint32_t v = t->slot[i];
        if (v == 0)
            return MR_TOKEN_NULL;
        uint32_t id = v - 1;
        if (t->len[id] == len && memcmp(t->text + t->off[id], text, len) == 0)
            return (mr_token)id;
        i = (i + 1) & t->slot_mask;
    }
}

uint32_t mr_tok_n_vocab(const mr_tokenizer *t) { return t->n; }
enum mr_tok_model mr_tok_model(const mr_tokenizer *t) { return t->model; }
const char *mr_tok_pre_name(const mr_tokenizer *t) { return t->pre_name; }
mr_token mr_tok_bos(const mr_tokenizer *t) { return t->bos; }
mr_token mr_tok_eos(const mr_tokenizer *t) { return t->eos; }
mr_token mr_tok_eot(const mr_tokenizer *t) { return t->eot; }
mr_token mr_tok_pad(const mr_tokenizer *t) { return t->pad; }
mr_token mr_tok_unk(const mr_tokenizer *t) { return t->unk; }
bool mr_tok_add_bos(const mr_tokenizer *t) { return t->add_bos; }
bool mr_tok_add_eos(const mr_tokenizer *t) { return t->add_eos; }

bool mr_tok_is_eog(const mr_tokenizer *t, mr_token id)
{
    if (id < 0)
        return false;
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return true;
    return false;
}

enum mr_tok_type mr_tok_type(const mr_tokenizer *t, mr_token id)
{
    if (id < 0 || (uint32_t)id >= t->n)
        return MR_TOKTYPE_UNDEFINED;
    return (enum mr_tok_type)t->type[id];
}

const char *mr_tok_text(const mr_tokenizer *t, mr_token id, size_t *len)
{
    if (id < 0 || (uint32_t)id >= t->n)
        return NULL;
    if (len)
        *len = t->len[id];
    return t->text + t->off[id];
}

/* ---- loading ---- */

void mr_tok_free(mr_tokenizer *t)
{
    if (!t)
        return;
    free(t->text);
    free(t->off);
    free(t->len);
    free(t->score);
    free(t->type);
    free(t->strip);
    free(t->slot);
    free(t->merge);
    free(t->piece);
    free(t->poff);
    free(t->plen);
    free(t->special);
    free(t->eog);
    free(t);
}

/* GPT-2's byte-to-character map: printable Latin-1 bytes stand for
 * themselves, the others are moved to U+0100 and up, in byte order. */
static uint32_t byte_to_cp(unsigned b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return b;
    unsigned k = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)))
            k++;
    return 0x100 + k;
}

static int cp_to_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp < 0x100 || cp >= 0x100 + 68)
        return -1;
    unsigned k = cp - 0x100;
    for (unsigned c = 0; c < 256; c++) {
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) {
            if (k == 0)
                return (int)c;
            k--;
        }
    }
    return -1;
}

static int get_id(const mr_gguf *g, const char *key, uint32_t n, mr_token *id, mr_err *err)
{
    const mr_gguf_kv *kv = mr_gguf_find(g, key);
    if (!kv)
        return 0;
    uint64_t v;
    if (mr_gguf_get_u64(g, key, &v, err))
        return -1;
    if (v >= n) /* upstream ignores an out-of-range id; so do we */
        return 0;
    *id = (mr_token)v;
    return 0;
}

static int get_flag(const mr_gguf *g, const char *key, bool *out, mr_err *err)
{
    if (!mr_gguf_find(g, key))
        return 0;
    return mr_gguf_get_bool(g, key, out, err);
}

static int add_eog(mr_tokenizer *t, mr_token id)
{
    if (id < 0 || mr_tok_is_eog(t, id))
        return 0;
    mr_token *e = realloc(t->eog, (t->n_eog + 1) * sizeof *e);
    if (!e)
        return -1;
    t->eog = e;
    t->eog[t->n_eog++] = id;
    return 0;
}

static const char *const eot_names[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", ("<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"),
    "<end_of_utterance>",
};
static const char *const eog_names[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>",
};

static int cmp_special(const void *a, const void *b, void *ctx)
{
    const mr_tokenizer *t = ctx;
    mr_token x = *(const mr_token *)a, y = *(const mr_token *)b;
    if (t->len[x] != t->len[y])
        return t->len[x] > t->len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int build_pieces(mr_tokenizer *t, mr_err *err);

int mr_tok_load(const mr_gguf *g, mr_tokenizer **out, mr_err *err)
{
    *out = NULL;
    char *model = NULL, *pre = NULL;
    mr_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return mr_errf(err, "tokenizer: out of memory");
    if (mr_gguf_get_str(g, "tokenizer.ggml.model", &model, err))
        goto fail;
    bool gemma4 = strcmp(model, "gemma4") == 0;
    if (strcmp(model, "gpt2") == 0 || gemma4) {
        t->model = MR_TOK_MODEL_BPE;
    } else if (strcmp(model, "llama") == 0) {
        t->model = MR_TOK_MODEL_SPM;
    } else if (strcmp(model, "bert") == 0) {
        t->model = MR_TOK_MODEL_WPM;
    } else {
        mr_errf(err, "tokenizer.ggml.model: '%.100s' is not supported (gpt2, llama, bert)", model);
        goto fail;
    }
    if (mr_gguf_find(g, "tokenizer.ggml.pre") && mr_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err))
        goto fail;
    snprintf(t->pre_name, sizeof t->pre_name, "%s", pre ? pre : "");
    if (t->model == MR_TOK_MODEL_BPE) {
        int p = gemma4 ? MR_PRE_GEMMA4 : mr_pre_from_name(pre, &t->ignore_merges);
        if (p < 0) {
            mr_errf(err, "tokenizer.ggml.pre: unknown pre-tokenizer '%.100s'", pre);
            goto fail;
        }
        t->pre = (enum mr_pre)p;
        /* Hugging Face's Qwen2 tokenizers normalize to NFC before splitting */
        t->nfc = t->pre == MR_PRE_QWEN2 || t->pre == MR_PRE_QWEN35;
        t->bpe_raw = t->pre == MR_PRE_GEMMA4;
        t->add_bos = t->pre == MR_PRE_LLAMA3 || t->bpe_raw;
    } else if (t->model == MR_TOK_MODEL_SPM) {
        t->pre = MR_PRE_NONE;
        t->add_bos = true;
        t->add_space_prefix = true;
    } else {
        t->pre = MR_PRE_NONE;
        t->add_bos = true; /* [CLS] ... [SEP] */
        t->add_eos = true;
    }

    /* tokens */
    const mr_gguf_kv *tok;
    if (mr_gguf_get_arr(g, "tokenizer.ggml.tokens", MR_GGUF_STRING, &tok, err))
        goto fail;
    if (tok->v.arr.n == 0 || tok->v.arr.n >= INT32_MAX) {
        mr_errf(err, "tokenizer.ggml.tokens: %llu entries (expected 1 .. 2^31-2)",
                (unsigned long long)tok->v.arr.n);
        goto fail;
    }
    t->n = (uint32_t)tok->v.arr.n;
    size_t total = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        if (tok->v.arr.strs[i].len > UINT32_MAX / 2) {
            mr_errf(err, "tokenizer.ggml.tokens[%u]: %llu bytes", i,
                    (unsigned long long)tok->v.arr.strs[i].len);
            goto fail;
        }
        total += tok->v.arr.strs[i].len + 1;
    }
    if (total > UINT32_MAX) {
        mr_errf(err, "tokenizer.ggml.tokens: %zu bytes in all (at most 4 GiB)", total);
        goto fail;
    }
    t->text = malloc(total);
    t->off = malloc(t->n * sizeof *t->off);
    t->len = malloc(t->n * sizeof *t->len);
    t->score = calloc(t->n, sizeof *t->score);
    t->type = malloc(t->n);
    t->strip = calloc(t->n, 1);
    if (!t->text || !t->off || !t->len || !t->score || !t->type || !t->strip) {
        mr_errf(err, "tokenizer: out of memory for %u tokens", t->n);
        goto fail;
    }
    size_t pos = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        const mr_str *s = &tok->v.arr.strs[i];
        memcpy(t->text + pos, s->ptr, s->len);
        t->text[pos + s->len] = '\0';
        t->off[i] = (uint32_t)pos;
        t->len[i] = (uint32_t)s->len;
        pos += s->len + 1;
        t->type[i] = MR_TOKTYPE_NORMAL;
        if (s->len > t->max_len)
            t->max_len = (uint32_t)s->len;
    }

    const mr_gguf_kv *kv;
    if (mr_gguf_find(g, "tokenizer.ggml.scores")) {
        if (mr_gguf_get_arr(g, "tokenizer.ggml.scores", MR_GGUF_VTYPE_COUNT, &kv, err))
            goto fail;
        if (kv->v.arr.n < t->n || kv->v.arr.type == MR_GGUF_STRING || kv->v.arr.type == MR_GGUF_BOOL) {
            mr_errf(err, "tokenizer.ggml.scores: %llu numbers for %u tokens",
                    (unsigned long long)kv->v.arr.n, t->n);
            goto fail;
        }
        for (uint32_t i = 0; i < t->n; i++)
            t->score[i] = (float)mr_gguf_arr_f64(kv, i);
    }
    if (mr_gguf_find(g, "tokenizer.ggml.token_type")) {
        if (mr_gguf_get_arr(g, "tokenizer.ggml.token_type", MR_GGUF_VTYPE_COUNT, &kv, err))
            goto fail;
        if (kv->v.arr.n < t->n || kv->v.arr.type == MR_GGUF_STRING || kv->v.arr.type == MR_GGUF_FLOAT32 ||
            kv->v.arr.type == MR_GGUF_FLOAT64) {
            mr_errf(err, "tokenizer.ggml.token_type: %llu integers for %u tokens",
                    (unsigned long long)kv->v.arr.n, t->n);
            goto fail;
        }
        for (uint32_t i = 0; i < t->n; i++) {
            int64_t v = mr_gguf_arr_i64(kv, i);
            t->type[i] = (v >= 1 && v <= 6) ? (uint8_t)v : MR_TOKTYPE_UNDEFINED;
        }
    }

    /* text -> id hash; a duplicated string keeps its first id */
    uint64_t nslots = 1;
    while (nslots < (uint64_t)t->n * 2)
        nslots <<= 1;
    t->slot = calloc(nslots, sizeof *t->slot);
    if (!t->slot) {
        mr_errf(err, "tokenizer: out of memory for the token index");
        goto fail;
    }
    t->slot_mask = nslots - 1;
    for (uint32_t i = 0; i < t->n; i++) {
        const char *s = t->text + t->off[i];
        if (mr_tok_find(t, s, t->len[i]) != MR_TOKEN_NULL)
            continue;
        uint64_t h = mr_tok_hash(s, t->len[i]) & t->slot_mask;
        while (t->slot[h])
            h = (h + 1) & t->slot_mask;
        t->slot[h] = i + 1;
    }

    /* byte tokens */
    for (unsigned b = 0; b < 256; b++) {
        t->byte_tok[b] = MR_TOKEN_NULL;
        char buf[8];
        if (t->model == MR_TOK_MODEL_BPE && !t->bpe_raw) {
            size_t l = mr_utf8_encode(byte_to_cp(b), buf);
            t->byte_tok[b] = mr_tok_find(t, buf, l);
            memcpy(t->bchar[b], buf, l); /* l <= 2: the characters are below U+0800 */
            t->bchar_len[b] = (uint8_t)l;
        } else {
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            t->byte_tok[b] = mr_tok_find(t, buf, 6);
            if (t->byte_tok[b] == MR_TOKEN_NULL) {
                buf[0] = (char)b;
                t->byte_tok[b] = mr_tok_find(t, buf, 1);
            }
        }
    }

    /* BPE merges: "left right" -> rank, as (left id, right id) -> merged id */
    if (t->model == MR_TOK_MODEL_BPE) {
        if (mr_gguf_get_arr(g, "tokenizer.ggml.merges", MR_GGUF_STRING, &kv, err))
            goto fail;
        uint64_t nm = kv->v.arr.n;
        if (nm >= INT32_MAX) {
            mr_errf(err, "tokenizer.ggml.merges: %llu entries", (unsigned long long)nm);
            goto fail;
        }
        uint64_t ms = 1;
        while (ms < nm * 2 + 2)
            ms <<= 1;
        t->merge = calloc(ms, sizeof *t->merge);
        if (!t->merge) {
            mr_errf(err, "tokenizer: out of memory for %llu merges", (unsigned long long)nm);
            goto fail;
        }
        t->mmask = ms - 1;
        for (uint64_t i = 0; i < nm; i++) {
            const mr_str *s = &kv->v.arr.strs[i];
            /* the separator is the first space after the first byte */
            const char *sp = s->len > 1 ? memchr(s->ptr + 1, ' ', s->len - 1) : NULL;
            if (!sp) {
                mr_errf(err, "tokenizer.ggml.merges[%llu]: no ' ' separating two tokens",
                        (unsigned long long)i);
                goto fail;
            }
            size_t ll = (size_t)(sp - s->ptr), rl = s->len - ll - 1;
            mr_token a = mr_tok_find(t, s->ptr, ll), b = mr_tok_find(t, sp + 1, rl);
            if (a == MR_TOKEN_NULL || b == MR_TOKEN_NULL)
                continue; /* can never apply: its parts are not tokens */
            char stackbuf[256];
            char *cat = ll + rl <= sizeof stackbuf ? stackbuf : malloc(ll + rl);
            if (!cat) {
                mr_errf(err, "tokenizer: out of memory");
                goto fail;
            }
            memcpy(cat, s->ptr, ll);
            memcpy(cat + ll, sp + 1, rl);
            mr_token r = mr_tok_find(t, cat, ll + rl);
            if (cat != stackbuf)
                free(cat);
            if (r == MR_TOKEN_NULL)
                continue; /* its result is not a token */
            uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
            uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> 20 & t->mmask;
            while (t->merge[h].key && t->merge[h].key != key)
                h = (h + 1) & t->mmask;
            if (t->merge[h].key)
                continue; /* duplicate pair: the first (lowest) rank wins */
            t->merge[h].key = key;
            t->merge[h].rank = (uint32_t)i;
            t->merge[h].res = r;
        }
    }

    /* special ids and flags */
    t->bos = t->eos = t->eot = t->eom = t->pad = t->unk = MR_TOKEN_NULL;
    if (t->model == MR_TOK_MODEL_SPM) {
        t->unk = t->n > 0 ? 0 : MR_TOKEN_NULL;
        t->bos = t->n > 1 ? 1 : MR_TOKEN_NULL;
        t->eos = t->n > 2 ? 2 : MR_TOKEN_NULL;
    } else if (t->model == MR_TOK_MODEL_WPM) {
        /* BERT: [UNK] 100, [CLS] 101 opens, [SEP] 102 closes */
        t->unk = t->n > 100 ? 100 : MR_TOKEN_NULL;
        t->bos = t->n > 101 ? 101 : MR_TOKEN_NULL;
        t->eos = t->n > 102 ? 102 : MR_TOKEN_NULL;
        if (get_id(g, "tokenizer.ggml.cls_token_id", t->n, &t->bos, err) ||
            get_id(g, "tokenizer.ggml.seperator_token_id", t->n, &t->eos, err))
            goto fail;
    }
    if (get_id(g, "tokenizer.ggml.bos_token_id", t->n, &t->bos, err) ||
        get_id(g, "tokenizer.ggml.eos_token_id", t->n, &t->eos, err) ||
        get_id(g, "tokenizer.ggml.eot_token_id", t->n, &t->eot, err) ||
        get_id(g, "tokenizer.ggml.eom_token_id", t->n, &t->eom, err) ||
        get_id(g, "tokenizer.ggml.padding_token_id", t->n, &t->pad, err) ||
        get_id(g, "tokenizer.ggml.unknown_token_id", t->n, &t->unk, err) ||
        get_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err) ||
        get_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err) ||
        get_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err))
        goto fail;
    if (t->bpe_raw)
        t->add_bos = true; /* as upstream does for Gemma 4, whatever the file says */
    if (t->add_bos && t->bos == MR_TOKEN_NULL)
        t->add_bos = false;
    if (t->add_eos && t->eos == MR_TOKEN_NULL)
        t->add_eos = false;

    /* end-of-turn and end-of-generation markers, by their usual names; like
     * upstream, such a token is treated as a control token */
    if (t->eot == MR_TOKEN_NULL) {
        for (size_t i = 0; i < sizeof eot_names / sizeof *eot_names && t->eot == MR_TOKEN_NULL; i++)
            t->eot = mr_tok_find(t, eot_names[i], strlen(eot_names[i]));
    }
    if (t->eom == MR_TOKEN_NULL)
        t->eom = mr_tok_find(t, "<|eom_id|>", 10);
    if (add_eog(t, t->eos) || add_eog(t, t->eot) || add_eog(t, t->eom)) {
        mr_errf(err, "tokenizer: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < sizeof eog_names / sizeof *eog_names; i++) {
        if (add_eog(t, mr_tok_find(t, eog_names[i], strlen(eog_names[i])))) {
            mr_errf(err, "tokenizer: out of memory");
            goto fail;
        }
    }
    for (size_t i = 0; i < t->n_eog; i++) {
        if (t->eog[i] != t->eos && t->type[t->eog[i]] != MR_TOKTYPE_CONTROL)
            t->type[t->eog[i]] = MR_TOKTYPE_CONTROL;
    }

    /* tokens recognised in text: control, user-defined and unknown, longest first */
    for (uint32_t i = 0; i < t->n; i++) {
        uint8_t ty = t->type[i];
        if ((ty == MR_TOKTYPE_CONTROL || ty == MR_TOKTYPE_USER_DEFINED || ty == MR_TOKTYPE_UNKNOWN) &&
            t->len[i] > 0)
            t->n_special++;
    }
    t->special = malloc((t->n_special + 1) * sizeof *t->special);
    if (!t->special) {
        mr_errf(err, "tokenizer: out of memory");
        goto fail;
    }
    t->n_special = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        uint8_t ty = t->type[i];
        if ((ty == MR_TOKTYPE_CONTROL || ty == MR_TOKTYPE_USER_DEFINED || ty == MR_TOKTYPE_UNKNOWN) &&
            t->len[i] > 0)
            t->special[t->n_special++] = (mr_token)i;
    }
    qsort_r(t->special, t->n_special, sizeof *t->special, cmp_special, t);

    if (build_pieces(t, err))
        goto fail;
    free(model);
    free(pre);
    *out = t;
    return 0;
fail:
    free(model);
    free(pre);
    mr_tok_free(t);
    return -1;
}

int mr_tok_load_file(const char *path, mr_tokenizer **out, mr_err *err)
{
    mr_gguf *g;
    *out = NULL;
    if (mr_gguf_open(path, &g, err))
        return -1;
    int rc = mr_tok_load(g, out, err);
    if (rc)
        mr_err_wrap(err, "%s", path);
    mr_gguf_close(g);
    return rc;
}

/* ---- decoding ---- */

/* The bytes a token stands for in normal decoding. */
static int piece_of(const mr_tokenizer *t, uint32_t id, mr_bytes *b)
{
    const char *s = t->text + t->off[id];
    size_t n = t->len[id];
    switch (t->type[id]) {
    case MR_TOKTYPE_CONTROL:
    case MR_TOKTYPE_UNKNOWN:
    case MR_TOKTYPE_USER_DEFINED:
        return mr_bytes_append(b, s, n);
    case MR_TOKTYPE_BYTE:
        if (t->model == MR_TOK_MODEL_SPM || t->bpe_raw) {
            unsigned v;
            if (n == 6 && sscanf(s, "<0x%2X>", &v) == 1) {
                char c = (char)v;
                return mr_bytes_append(b, &c, 1);
            }
            return 0;
        }
        /* a byte-level BPE byte token reads as normal text */
        __attribute__((fallthrough));
    case MR_TOKTYPE_NORMAL:
        if (t->model != MR_TOK_MODEL_BPE || t->bpe_raw) {
            /* U+2581 (e2 96 81) is the space */
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    if (mr_bytes_append(b, " ", 1))
                        return -1;
                    i += 3;
                } else {
                    if (mr_bytes_append(b, s + i, 1))
                        return -1;
                    i++;
                }
            }
            return 0;
        }
        for (size_t i = 0; i < n;) {
            size_t l;
            uint32_t cp = mr_utf8_decode((const uint8_t *)s + i, n - i, &l);
            int byte = cp_to_byte(cp);
            if (byte >= 0) {
                char c = (char)byte;
                if (mr_bytes_append(b, &c, 1))
                    return -1;
            } else if (mr_bytes_append(b, s + i, l)) { /* not a byte character: keep it */
                return -1;
            }
            i += l;
        }
        return 0;
    default: /* unused, undefined: nothing */
        return 0;
    }
}

static int build_pieces(mr_tokenizer *t, mr_err *err)
{
    mr_bytes all = {0};
    t->poff = malloc(t->n * sizeof *t->poff);
    t->plen = malloc(t->n * sizeof *t->plen);
    if (!t->poff || !t->plen)
        return mr_errf(err, "tokenizer: out of memory");
    for (uint32_t i = 0; i < t->n; i++) {
        size_t before = all.len;
        if (piece_of(t, i, &all) || all.len > UINT32_MAX) {
            mr_bytes_free(&all);
            return mr_errf(err, "tokenizer: out of memory for token pieces");
        }
        t->poff[i] = (uint32_t)before;
        t->plen[i] = (uint32_t)(all.len - before);
    }
    t->piece = all.data ? all.data : malloc(1);
    return t->piece ? 0 : mr_errf(err, "tokenizer: out of memory");
}

const char *mr_tok_piece_view(const mr_tokenizer *t, mr_token id, unsigned flags, size_t *len)
{
    if (id < 0 || (uint32_t)id >= t->n)
        return NULL;
    const char *p = t->piece + t->poff[id];
    size_t n = t->plen[id];
    uint8_t ty = t->type[id];
    if ((ty == MR_TOKTYPE_CONTROL || ty == MR_TOKTYPE_UNKNOWN) && !(flags & MR_DETOK_SPECIAL))
        n = 0;
    if ((flags & MR_DETOK_STRIP_LEADING_SPACE) && n > 0 && p[0] == ' ') {
        p++;
        n--;
    }
    *len = n;
    return p;
}

int mr_tok_piece(const mr_tokenizer *t, mr_token id, unsigned flags, mr_bytes *out, mr_err *err)
{
    size_t n;
    const char *p = mr_tok_piece_view(t, id, flags, &n);
    if (!p)
        return mr_errf(err, "detokenize: token id %d out of range (vocabulary of %u)", id, t->n);
    if (mr_bytes_append(out, p, n))
        return mr_errf(err, "detokenize: out of memory");
    return 0;
}

int mr_tok_decode(const mr_tokenizer *t, const mr_token *ids, size_t n, unsigned flags,
                  mr_bytes *out, mr_err *err)
{
    for (size_t i = 0; i < n; i++) {
        unsigned f = flags;
        if (i > 0)
            f &= ~(unsigned)MR_DETOK_STRIP_LEADING_SPACE;
        if (mr_tok_piece(t, ids[i], f, out, err))
            return -1;
    }
    return 0;
}

/* ---- streaming ---- */

struct mr_detok_stream {
    const mr_tokenizer *t;
    unsigned flags;
    bool first;
    mr_bytes pend; /* bytes not yet emitted: at most an unfinished UTF-8 sequence */
};

mr_detok_stream *mr_detok_stream_new(const mr_tokenizer *t, unsigned flags)
{
    mr_detok_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->t = t;
    s->flags = flags;
    s->first = true;
    return s;
}

void mr_detok_stream_free(mr_detok_stream *s)
{
    if (!s)
        return;
    mr_bytes_free(&s->pend);
    free(s);
}

/* Length of the valid UTF-8 sequence at s[0..n): 1..4; 0 when it is a
 * proper prefix of a valid sequence; -k when it is invalid, k >= 1 being the
 * length of its maximal subpart (the longest prefix that could start a valid
 * sequence), which the Unicode Standard (3.9, "U+FFFD substitution of
 * maximal subparts") and WHATWG's decoder replace by one U+FFFD. */
static int utf8_seq(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    if (c < 0x80)
        return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF; /* bounds of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0; /* no overlong forms */
        if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F; /* nothing past U+10FFFF */
    } else {
        return -1;
    }
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n)
            return 0;
        uint8_t x = s[i];
        if (i == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF))
            return -i; /* s[0..i) is the maximal subpart: one U+FFFD */
    }
    return need;
}

/* Emits the valid part of pend; keeps an unfinished tail unless final. */
static int stream_drain(mr_detok_stream *s, bool final, mr_bytes *out)
{
    if (s->pend.len == 0)
        return 0;
    const uint8_t *p = (const uint8_t *)s->pend.data;
    size_t n = s->pend.len, i = 0, run = 0;
    while (i < n) {
        int l = utf8_seq(p + i, n - i);
        if (l > 0) {
            i += (size_t)l;
            continue;
        }
        if (l == 0 && !final)
            break; /* unfinished: wait for the next token */
        if (mr_bytes_append(out, p + run, i - run) || mr_bytes_append(out, "\xef\xbf\xbd", 3))
            return -1;
        i += l < 0 ? (size_t)-l : 1;
        if (l == 0) /* final: the whole unfinished tail becomes one U+FFFD */
            i = n;
        run = i;
    }
    if (mr_bytes_append(out, p + run, i - run))
        return -1;
    if (n > i)
        memmove(s->pend.data, s->pend.data + i, n - i);
    s->pend.len = n - i;
    return 0;
}

int mr_detok_stream_push(mr_detok_stream *s, mr_token id, mr_bytes *out, mr_err *err)
{
    unsigned f = s->flags;
    if (!s->first)
        f &= ~(unsigned)MR_DETOK_STRIP_LEADING_SPACE;
    if (mr_tok_piece(s->t, id, f, &s->pend, err))
        return -1;
    s->first = false; /* as in mr_tok_decode: only the first token is stripped */
    if (stream_drain(s, false, out))
        return mr_errf(err, "detokenize: out of memory");
    return 0;
}

int mr_detok_stream_flush(mr_detok_stream *s, mr_bytes *out, mr_err *err)
{
    if (stream_drain(s, true, out))
        return mr_errf(err, "detokenize: out of memory");
    return 0;
}

/* ---- encoding ---- */

typedef struct frag {
    size_t off, len;
    mr_token id; /* MR_TOKEN_NULL: raw text */
} frag;

typedef struct fraglist {
    frag *f;
    size_t n, cap;
} fraglist;

static int frag_push(fraglist *l, size_t off, size_t len, mr_token id)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        frag *f = realloc(l->f, cap * sizeof *f);
        if (!f)
            return -1;
        l->f = f;
        l->cap = cap;
    }
    l->f[l->n++] = (frag){off, len, id};
    return 0;
}

static inline bool is_space_byte(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Cuts the special tokens out of the raw fragments, longest token first,
 * every occurrence left to right (upstream's partitioning). */
static int partition(const mr_tokenizer *t, const char *text, size_t len, bool parse_special,
                     fraglist *fl)
{
    fraglist tmp = {0};
    if (len == 0)
        return 0; /* nothing, not even an SPM prefix space */
    if (frag_push(fl, 0, len, MR_TOKEN_NULL))
        return -1;
    /* With many special tokens (some vocabularies have thousands of
     * user-defined ones), skip at once every token whose first two bytes
     * never occur in the text: one pass over the text instead of one
     * search per token. */
    uint64_t *pairs = NULL;
    uint64_t bytes[4] = {0};
    if (t->n_special > 32 && (pairs = calloc(1024, sizeof *pairs)) != NULL) {
        const uint8_t *u = (const uint8_t *)text;
        for (size_t i = 0; i < len; i++) {
            bytes[u[i] >> 6] |= 1ull << (u[i] & 63);
            if (i + 1 < len) {
                unsigned pr = (unsigned)u[i] << 8 | u[i + 1];
                pairs[pr >> 6] |= 1ull << (pr & 63);
            }
        }
    }
    for (size_t k = 0; k < t->n_special; k++) {
        mr_token id = t->special[k];
        uint8_t ty = t->type[id];
        if (!parse_special && (ty == MR_TOKTYPE_CONTROL || ty == MR_TOKTYPE_UNKNOWN))
            continue;
        const char *st = t->text + t->off[id];
        size_t sl = t->len[id];
        if (pairs) {
            const uint8_t *u = (const uint8_t *)st;
            if (sl > len || !(bytes[u[0] >> 6] & (1ull << (u[0] & 63))))
                continue;
            if (sl >= 2) {
                unsigned pr = (unsigned)u[0] << 8 | u[1];
                if (!(pairs[pr >> 6] & (1ull << (pr & 63))))
                    continue;
            }
        }
        bool any = false;
        for (size_t i = 0; i < fl->n && !any; i++)
            if (fl->f[i].id == MR_TOKEN_NULL && fl->f[i].len >= sl &&
                memmem(text + fl->f[i].off, fl->f[i].len, st, sl))
                any = true;
        if (!any)
            continue;
        tmp.n = 0;
        for (size_t i = 0; i < fl->n; i++) {
            frag f = fl->f[i];
            if (f.id != MR_TOKEN_NULL) {
                if (frag_push(&tmp, f.off, f.len, f.id))
                    goto oom;
                continue;
            }
            size_t off = f.off, rem = f.len;
            while (rem > 0) {
                const char *m = rem >= sl ? memmem(text + off, rem, st, sl) : NULL;
                if (!m) {
                    if (frag_push(&tmp, off, rem, MR_TOKEN_NULL))
                        goto oom;
                    break;
                }
                size_t mo = (size_t)(m - text);
                size_t left = mo - off;
                if (t->strip[id] & 1)
                    while (left > 0 && is_space_byte(text[off + left - 1]))
                        left--;
                if (left > 0 && frag_push(&tmp, off, left, MR_TOKEN_NULL))
                    goto oom;
                if (frag_push(&tmp, mo, sl, id))
                    goto oom;
                size_t roff = mo + sl, rlen = off + rem - roff;
                if (t->strip[id] & 2)
                    while (rlen > 0 && is_space_byte(text[roff])) {
                        roff++;
                        rlen--;
                    }
                off = roff;
                rem = rlen;
            }
        }
        fraglist sw = *fl;
        *fl = tmp;
        tmp = sw;
    }
    free(pairs);
    free(tmp.f);
    return 0;
oom:
    free(pairs);
    free(tmp.f);
    return -1;
}

int mr_tok_encode(const mr_tokenizer *t, const char *text, size_t len, unsigned flags,
                  mr_tokens *out, mr_err *err)
{
    fraglist fl = {0};
    int rc = 0;
    if ((flags & MR_TOK_ADD_SPECIAL) && t->add_bos && mr_tokens_push(out, t->bos))
        goto oom;
    if (partition(t, text, len, (flags & MR_TOK_PARSE_SPECIAL) != 0, &fl))
        goto oom;
    bool prev_special = true; /* SPM: the text start counts as after a special token */
    char *buf = NULL;
    size_t bufcap = 0;
    for (size_t i = 0; i < fl.n && rc == 0; i++) {
        frag f = fl.f[i];
        if (f.id != MR_TOKEN_NULL) {
            if (mr_tokens_push(out, f.id)) {
                free(buf);
                goto oom;
            }
            prev_special = true;
            continue;
        }
        if (t->model == MR_TOK_MODEL_WPM) {
            rc = mr_wpm_encode(t, text + f.off, f.len, out, err);
        } else if (t->model == MR_TOK_MODEL_BPE && !t->bpe_raw) {
            char *norm = NULL;
            size_t nlen = 0;
            int nr = t->nfc ? mr_utf8_nfc(text + f.off, f.len, &norm, &nlen) : 0;
            if (nr < 0) {
                free(buf);
                goto oom;
            }
            if (nr > 0)
                rc = mr_bpe_encode(t, norm, nlen, out, err);
            else
                rc = mr_bpe_encode(t, text + f.off, f.len, out, err);
            free(norm);
        } else {
            /* SentencePiece (and SentencePiece-style BPE): optional leading
             * space, then every space becomes U+2581 */
            size_t spaces = 0;
            for (size_t j = 0; j < f.len; j++)
                spaces += text[f.off + j] == ' ';
            bool prefix = t->model == MR_TOK_MODEL_SPM && t->add_space_prefix && prev_special;
            size_t need = f.len + 2 * spaces + (prefix ? 3 : 0);
            if (need > bufcap) {
                char *nb = realloc(buf, need);
                if (!nb) {
                    free(buf);
                    goto oom;
                }
                buf = nb;
                bufcap = need;
            }
            size_t o = 0;
            if (prefix) {
                memcpy(buf, "\xe2\x96\x81", 3);
                o = 3;
            }
            for (size_t j = 0; j < f.len; j++) {
                char c = text[f.off + j];
                if (c == ' ') {
                    memcpy(buf + o, "\xe2\x96\x81", 3);
                    o += 3;
                } else {
                    buf[o++] = c;
                }
            }
            if (t->model == MR_TOK_MODEL_SPM)
                rc = mr_spm_encode(t, buf, o, out, err);
            else
                rc = mr_bpe_encode(t, buf, o, out, err);
        }
        prev_special = false;
    }
    free(buf);
    free(fl.f);
    if (rc)
        return -1;
    if ((flags & MR_TOK_ADD_SPECIAL) && t->add_eos && mr_tokens_push(out, t->eos))
        return mr_errf(err, "tokenize: out of memory");
    return 0;
oom:
    free(fl.f);
    return mr_errf(err, "tokenize: out of memory");
}
