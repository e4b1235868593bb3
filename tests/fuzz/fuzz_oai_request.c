/* libFuzzer target: OpenAI request bodies through mr_oai_parse.  The first
 * byte picks the schema (odd: chat, even: completions), the rest is the body.
 * An accepted request must hold what the rest of the gateway relies on: a
 * model, non-empty messages or prompt, stop strings and sampling inside the
 * bounds proto/msg.h documents.  A refused one must carry a 4xx/5xx status,
 * a message, and an error body that parses back into the OpenAI shape
 * {"error":{"message":..., "type":..., ...}}. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/openai.h"

static bool in(float x, float lo, float hi, bool lo_open)
{
    /* written so that NaN is outside every range */
    return (lo_open ? x > lo : x >= lo) && x <= hi;
}

static void check_sampling(const mr_sampling *s)
{
    if (!in(s->temperature, 0, 2, false) || !in(s->top_p, 0, 1, true) || !in(s->min_p, 0, 1, false) ||
        !in(s->presence_penalty, -2, 2, false) || !in(s->frequency_penalty, -2, 2, false) ||
        !in(s->repetition_penalty, 0, 10, true) || s->top_logprobs > MR_MSG_MAX_TOP_LOGPROBS)
        abort();
}

static void check_accepted(const mr_oai_req *r)
{
    if (!r->model)
        abort();
    if (r->chat) {
        if (!json_is_array(r->messages) || json_array_size(r->messages) == 0)
            abort();
    } else {
        bool text = r->prompt && r->prompt_len > 0;
        bool ids = r->prompt_ids && r->n_prompt_ids > 0 && r->n_prompt_ids <= MR_MSG_MAX_TOKENS;
        if (!text && !ids)
            abort();
    }
    if (r->n_stops < 0 || r->n_stops > MR_MAX_STOPS)
        abort();
    for (int i = 0; i < r->n_stops; i++) {
        size_t n = r->stops[i] ? strlen(r->stops[i]) : 0;
        if (n < 1 || n > MR_MAX_STOP_LEN)
            abort();
    }
    check_sampling(&r->samp);
}

static void check_refused(const mr_oai_error *e)
{
    if (e->status < 400 || e->status > 599 || !e->message[0])
        abort();
    char *body = mr_oai_error_json(e);
    if (!body)
        abort();
    json_t *o = json_loads(body, 0, NULL);
    json_t *er = json_object_get(o, "error");
    if (!json_is_object(o) || !json_is_object(er) || !json_is_string(json_object_get(er, "message")) ||
        !json_is_string(json_object_get(er, "type")))
        abort();
    json_decref(o);
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    bool chat = data[0] & 1;
    mr_oai_req r;
    mr_oai_error e;
    memset(&e, 0, sizeof e);
    if (mr_oai_parse((const char *)data + 1, size - 1, chat, &r, &e) == 0)
        check_accepted(&r);
    else
        check_refused(&e);
    mr_oai_req_free(&r);
    return 0;
}
