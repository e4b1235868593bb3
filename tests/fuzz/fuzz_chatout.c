/* libFuzzer target: the chat reply splitter (gateway/chatout.h).  The first
 * byte picks the format (reasoning on or off, opened by the prompt or not,
 * no calls, hermes or qwen3_xml calls), the second the piece size; the rest
 * is the reply.  Fed in pieces it must split exactly as fed whole (a
 * stream shows what the blocking reply holds); every text it gives out of
 * a valid UTF-8 reply is valid UTF-8, and every call's arguments are a JSON
 * object (jansson is the judge of both). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/chatout.h"

static json_t *tools;

/* The events of one run, flattened: kind byte, then the text (or
 * name NUL arguments) and a NUL, consecutive text of one kind joined. */
static void flatten(mr_buf *out, int *last, mr_co_events *ev)
{
    for (size_t i = 0; i < ev->n; i++) {
        mr_co_event *e = &ev->v[i];
        if (e->kind == MR_CO_TOOL) {
            const char *name = json_string_value(json_object_get(e->call, "name"));
            const char *args = json_string_value(json_object_get(e->call, "arguments"));
            if (!name || !args)
                abort();
            json_t *a = json_loads(args, 0, NULL);
            if (!json_is_object(a))
                abort();
            json_decref(a);
            mr_buf_add(out, "T", 1);
            mr_buf_add(out, name, strlen(name) + 1);
            mr_buf_add(out, args, strlen(args) + 1);
            *last = -1;
            continue;
        }
        if ((int)e->kind != *last) {
            if (*last >= 0)
                mr_buf_add(out, "", 1);
            mr_buf_add(out, e->kind == MR_CO_CONTENT ? "C" : "R", 1);
            *last = (int)e->kind;
        }
        mr_buf_add(out, e->text.p, e->text.len);
    }
    mr_co_events_clear(ev);
}

static void run(const mr_chat_format *f, bool in_think, json_t *t, const char *s, size_t n, size_t step,
                mr_buf *out)
{
    mr_chatout c;
    mr_co_events ev = {0};
    int last = -1;
    mr_chatout_init(&c, f, in_think, t, true, true);
    for (size_t i = 0; i < n;) {
        size_t k = step && n - i > step ? step : n - i;
        mr_chatout_push(&c, s + i, k, &ev);
        flatten(out, &last, &ev);
        i += k;
    }
    mr_chatout_finish(&c, &ev);
    flatten(out, &last, &ev);
    mr_chatout_free(&c);
    mr_co_events_free(&ev);
}

/* Each text event of a flattened run is valid UTF-8. */
static void check_utf8(const mr_buf *b)
{
    size_t i = 0;
    while (i < b->len) {
        char kind = b->p[i++];
        size_t n = strnlen(b->p + i, b->len - i);
        if (kind == 'C' || kind == 'R') {
            json_t *j = json_stringn(b->p + i, n);
            if (!j)
                abort();
            json_decref(j);
            i += n + 1;
        } else { /* T: name NUL args NUL */
            i += n + 1;
            i += strnlen(b->p + i, b->len - i) + 1;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    if (!tools)
        tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                           "\"properties\":{\"n\":{\"type\":\"integer\"},\"x\":{\"type\":\"number\"},\"b\":{\"type\":"
                           "\"boolean\"},\"o\":{\"type\":\"object\"},\"a\":{\"type\":\"array\"},\"s\":{\"type\":"
                           "\"string\"}}}}}]",
                           0, NULL);
    mr_chat_format f = {.think = data[0] & 1, .tools = (mr_tool_format)((data[0] >> 1) % 3)};
    bool in_think = f.think && (data[0] & 8);
    json_t *t = data[0] & 16 ? NULL : tools;
    size_t step = data[1] % 17;
    const char *s = (const char *)data + 2;
    size_t n = size - 2;
    if (memchr(s, 0, n))
        return 0; /* NUL separates the flattened events below */

    mr_buf whole = {0}, pieces = {0};
    run(&f, in_think, t, s, n, 0, &whole);
    run(&f, in_think, t, s, n, step, &pieces);
    if (whole.len != pieces.len || (whole.len && memcmp(whole.p, pieces.p, whole.len)))
        abort();
    json_t *valid = json_stringn(s, n);
    if (valid)
        check_utf8(&whole);
    json_decref(valid);
    mr_buf_free(&whole);
    mr_buf_free(&pieces);
    return 0;
}
