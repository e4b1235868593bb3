#include "gateway/codec.h"

#include <stdlib.h>
#include <string.h>

#include "common/chat.h"
#include "common/gguf.h"
#include "common/tokenizer.h"

static int bytes_encode(mr_codec *c, const char *text, size_t len, bool chat, uint32_t **ids, uint32_t *n,
                        mr_err *err)
{
    uint32_t *v = malloc((len ? len : 1) * sizeof *v);
    if (!v)
        return mr_errf(err, "out of memory");
    for (size_t i = 0; i < len; i++)
        v[i] = (unsigned char)text[i];
    *ids = v;
    *n = (uint32_t)len;
    return 0;
}

static int bytes_piece(mr_codec *c, uint32_t id, mr_buf *out, mr_err *err)
{
    if (id > 255)
        return mr_errf(err, "token id %u outside the byte vocabulary", id);
    char ch = (char)id;
    mr_buf_add(out, &ch, 1);
    return 0;
}

/* ChatML: <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n */
static int chatml(mr_codec *c, const json_t *body, mr_buf *prompt, mr_err *err)
{
    const json_t *messages = json_object_get(body, "messages");
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        mr_buf_printf(prompt, "<|im_start|>%s\n", role ? role : "user");
        if (json_is_string(content)) {
            mr_buf_add(prompt, json_string_value(content), json_string_length(content));
        } else if (json_is_array(content)) {
            size_t j;
            json_t *part;
            json_array_foreach(content, j, part)
            {
                json_t *tx = json_object_get(part, "text");
                mr_buf_add(prompt, json_string_value(tx), json_string_length(tx));
            }
        }
        mr_buf_adds(prompt, "<|im_end|>\n");
    }
    mr_buf_adds(prompt, "<|im_start|>assistant\n");
    return 0;
}

/* A chat template rendered for a validated request body (tools, kwargs,
 * enable_thinking, add_generation_prompt). */
static int render(const mr_chat_tmpl *t, const json_t *body, mr_buf *prompt, mr_err *err)
{
    mr_chat_req req;
    if (mr_chat_req_from_json(body, &req, err))
        return -1;
    char *out = NULL;
    size_t len = 0;
    if (mr_chat_render(t, &req, NULL, &out, &len, err))
        return -1;
    mr_buf_add(prompt, out, len);
    free(out);
    return 0;
}

/* The byte codec renders chat as ChatML, or with a template text the
 * config gives (no BOS or EOS text: bytes have no special tokens). */
typedef struct bytes_codec {
    mr_codec super;
    mr_chat_tmpl *tmpl;
} bytes_codec;

static int bytes_chat(mr_codec *c, const json_t *body, mr_buf *prompt, mr_err *err)
{
    bytes_codec *b = (bytes_codec *)c;
    return b->tmpl ? render(b->tmpl, body, prompt, err) : chatml(c, body, prompt, err);
}

static void bytes_destroy(mr_codec *c)
{
    mr_chat_tmpl_free(((bytes_codec *)c)->tmpl);
    free(c->tmpl_text);
    free(c);
}

static mr_codec *bytes_open(const char *tmpl, mr_err *err)
{
    bytes_codec *b = calloc(1, sizeof *b);
    if (!b) {
        mr_errf(err, "out of memory");
        return NULL;
    }
    mr_codec *c = &b->super;
    c->kind = "bytes";
    c->n_vocab = 256;
    c->think_open_id = c->think_close_id = -1; /* bytes have no such tokens */
    c->encode = bytes_encode;
    c->piece = bytes_piece;
    c->chat = bytes_chat;
    c->destroy = bytes_destroy;
    if (tmpl) {
        b->tmpl = mr_chat_tmpl_new(tmpl, strlen(tmpl), NULL, NULL, err);
        c->tmpl_text = strdup(tmpl);
        if (!b->tmpl || !c->tmpl_text) {
            if (b->tmpl)
                mr_errf(err, "out of memory");
            mr_err_wrap(err, "chat template");
            bytes_destroy(c);
            return NULL;
        }
    }
    return c;
}

mr_codec *mr_codec_bytes(void) { return bytes_open(NULL, NULL); }

typedef struct gguf_codec {
    mr_codec super;
    mr_tokenizer *tok;
    mr_bytes piece; /* reused by every piece() call (all on the event loop) */
    mr_chat_tmpl *tmpl;
} gguf_codec;

static int gguf_encode(mr_codec *c, const char *text, size_t len, bool chat, uint32_t **ids, uint32_t *n,
                       mr_err *err)
{
    gguf_codec *g = (gguf_codec *)c;
    mr_tokens t = {0};
    if (mr_tok_encode(g->tok, text, len, chat ? MR_TOK_PARSE_SPECIAL : MR_TOK_ADD_SPECIAL, &t, err)) {
        mr_tokens_free(&t);
        return -1;
    }
    uint32_t *v = malloc((t.n ? t.n : 1) * sizeof *v);
    if (!v) {
        mr_tokens_free(&t);
        return mr_errf(err, "out of memory");
    }
    for (size_t i = 0; i < t.n; i++)
        v[i] = (uint32_t)t.ids[i];
    *ids = v;
    *n = (uint32_t)t.n;
    mr_tokens_free(&t);
    return 0;
}

static int gguf_piece(mr_codec *c, uint32_t id, mr_buf *out, mr_err *err)
{
    gguf_codec *g = (gguf_codec *)c;
    if (id >= mr_tok_n_vocab(g->tok))
        return mr_errf(err, "token id %u outside the vocabulary (%u)", id, mr_tok_n_vocab(g->tok));
    /* control tokens (end of turn, ...) decode to nothing */
    g->piece.len = 0;
    if (mr_tok_piece(g->tok, (mr_token)id, 0, &g->piece, err))
        return -1;
    mr_buf_add(out, g->piece.data ? g->piece.data : "", g->piece.len);
    return 0;
}

static int gguf_chat(mr_codec *c, const json_t *body, mr_buf *prompt, mr_err *err)
{
    gguf_codec *g = (gguf_codec *)c;
    return g->tmpl ? render(g->tmpl, body, prompt, err) : chatml(c, body, prompt, err);
}

static void gguf_destroy(mr_codec *c)
{
    gguf_codec *g = (gguf_codec *)c;
    mr_tok_free(g->tok);
    mr_bytes_free(&g->piece);
    mr_chat_tmpl_free(g->tmpl);
    free(c->tmpl_text);
    free(g);
}

static mr_codec *gguf_open(const char *path, const char *tmpl_override, mr_err *err)
{
    gguf_codec *g = calloc(1, sizeof *g);
    if (!g) {
        mr_errf(err, "out of memory");
        return NULL;
    }
    mr_gguf *f = NULL;
    if (mr_gguf_open(path, &f, err) || mr_tok_load(f, &g->tok, err)) {
        mr_gguf_close(f);
        free(g);
        return NULL;
    }
    /* models without a template (and no override) fall back to ChatML */
    const mr_gguf_kv *kv = mr_gguf_find(f, "tokenizer.chat_template");
    if (tmpl_override || kv) {
        g->tmpl = mr_chat_tmpl_from_gguf(f, tmpl_override, tmpl_override ? strlen(tmpl_override) : 0, err);
        if (g->tmpl) { /* it read the text, so kv is a string when there is no override */
            g->super.tmpl_text = tmpl_override ? strdup(tmpl_override) : strndup(kv->v.s.ptr, (size_t)kv->v.s.len);
            if (!g->super.tmpl_text)
                mr_errf(err, "out of memory");
        }
        if (!g->tmpl || !g->super.tmpl_text) {
            mr_err_wrap(err, "%s: chat template", path);
            mr_gguf_close(f);
            gguf_destroy(&g->super);
            return NULL;
        }
    }
    mr_gguf_close(f);
    g->super.kind = "gguf";
    g->super.n_vocab = mr_tok_n_vocab(g->tok);
    g->super.encode = gguf_encode;
    g->super.piece = gguf_piece;
    g->super.chat = gguf_chat;
    g->super.destroy = gguf_destroy;
    for (uint32_t id = 0; id < g->super.n_vocab && g->super.n_stop_ids < 64; id++)
        if (mr_tok_is_eog(g->tok, (mr_token)id))
            g->super.stop_ids[g->super.n_stop_ids++] = id;
    g->super.think_open_id = mr_tok_find(g->tok, "<think>", 7);
    g->super.think_close_id = mr_tok_find(g->tok, "</think>", 8);
    return &g->super;
}

mr_codec *mr_codec_open(const char *kind, const char *gguf_path, const char *tmpl_override, mr_err *err)
{
    if (!kind || !strcmp(kind, "bytes"))
        return bytes_open(tmpl_override, err);
    if (!strcmp(kind, "gguf"))
        return gguf_open(gguf_path, tmpl_override, err);
    mr_errf(err, "tokenizer \"%s\" for %s: not one of gguf, bytes", kind, gguf_path ? gguf_path : "(no model file)");
    return NULL;
}
