#include "gateway/codec.h"

#include <stdlib.h>
#include <string.h>

static int bytes_encode(mr_codec *c, const char *text, size_t len, uint32_t **ids, uint32_t *n, mr_err *err)
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
static int chatml(mr_codec *c, const json_t *messages, mr_buf *prompt, mr_err *err)
{
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

static void bytes_destroy(mr_codec *c) { free(c); }

mr_codec *mr_codec_bytes(void)
{
    mr_codec *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->kind = "bytes";
    c->n_vocab = 256;
    c->encode = bytes_encode;
    c->piece = bytes_piece;
    c->chat = chatml;
    c->destroy = bytes_destroy;
    return c;
}

mr_codec *mr_codec_open(const char *kind, const char *gguf_path, mr_err *err)
{
    if (!kind || !strcmp(kind, "bytes")) {
        mr_codec *c = mr_codec_bytes();
        if (!c)
            mr_errf(err, "out of memory");
        return c;
    }
    mr_errf(err, "tokenizer \"%s\" for %s: not available in this build (use \"bytes\")", kind,
            gguf_path ? gguf_path : "(no model file)");
    return NULL;
}
