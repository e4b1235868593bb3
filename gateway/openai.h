/* OpenAI request schemas (validation of /v1/chat/completions and
 * /v1/completions bodies) and the error shape
 * {"error":{"message","type","param","code"}}. */
#ifndef MR_OPENAI_H
#define MR_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "gateway/textout.h"
#include "gateway/util.h"
#include "proto/msg.h"

typedef struct mr_oai_error {
    int status;
    char message[512];
    char param[64];   /* "" = null */
    char code[48];    /* "" = null */
} mr_oai_error;

typedef struct mr_oai_req {
    bool chat;
    json_t *root;            /* owned; strings below point into it */
    const char *model;
    const json_t *messages;  /* chat */
    const char *prompt;      /* completions with a text prompt */
    size_t prompt_len;
    uint32_t *prompt_ids;    /* completions with token ids (owned) */
    uint32_t n_prompt_ids;
    bool has_max_tokens;
    uint32_t max_tokens;
    mr_sampling samp;
    const char *stops[MR_MAX_STOPS];
    int n_stops;
    bool stream, include_usage;
    const char *user;
    const char *cache_salt;
    /* chat: the tools whose calls are parsed from the reply (borrowed from
     * root; NULL when there are none or tool_choice is "none") */
    json_t *tools;
    /* "auto" or "none" (the model chooses); "required": at least one call;
     * a named function: exactly that one (tool_name) */
    enum { MR_TOOL_CHOICE_AUTO, MR_TOOL_CHOICE_REQUIRED, MR_TOOL_CHOICE_NAMED } tool_choice;
    const char *tool_name;
    /* the GBNF grammar (common/grammar.h) the output must follow, owned:
     * from response_format json_object/json_schema or the grammar field;
     * NULL: none (tool_choice's grammar is made where the model's tool-call
     * format is known) */
    char *grammar;
    const char *grammar_param; /* the field it came from, for errors */
    bool parallel_tool_calls; /* false: one call at most */
    bool include_reasoning;   /* false: the reasoning is not returned */
} mr_oai_req;

/* Parses and validates a request body.  On failure fills e (status 400 with
 * the offending param) and returns -1; r needs mr_oai_req_free either way. */
int mr_oai_parse(const char *body, size_t len, bool chat, mr_oai_req *r, mr_oai_error *e);
void mr_oai_req_free(mr_oai_req *r);

/* Fills e; type is derived from status.  Returns -1. */
int mr_oai_err(mr_oai_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The JSON body for e (malloc'd). */
char *mr_oai_error_json(const mr_oai_error *e);
const char *mr_oai_error_type(int status);

/* Body of an error from status + message alone (used for h2o's own errors). */
char *mr_oai_error_json_simple(int status, const char *message);

#endif
