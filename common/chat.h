/* Chat prompts: a chat request's messages, tools and template arguments
 * rendered into the prompt text with the model's chat template (the GGUF
 * `tokenizer.chat_template`, or an override from the config).
 *
 * The template sees: messages, tools (only when the request has tools),
 * add_generation_prompt, enable_thinking (only when set), bos_token,
 * eos_token, and every member of the request's chat_template_kwargs (which
 * win over the names above), plus the engine's globals (namespace, range,
 * raise_exception, strftime_now, ...). */
#ifndef MR_CHAT_H
#define MR_CHAT_H

#include <jansson.h>
#include <stddef.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/jinja.h"

typedef struct mr_chat_tmpl mr_chat_tmpl;

/* Parses a chat template; bos/eos may be NULL (empty strings then). */
mr_chat_tmpl *mr_chat_tmpl_new(const char *src, size_t len, const char *bos_token,
                               const char *eos_token, mr_err *err);
void mr_chat_tmpl_free(mr_chat_tmpl *ct);

/* The chat template of a GGUF model: `tokenizer.chat_template`, or override
 * (a template text from the config; override_len bytes) when not NULL, with
 * the texts of tokenizer.ggml.bos_token_id / eos_token_id as bos_token /
 * eos_token ("" when the model has none). */
mr_chat_tmpl *mr_chat_tmpl_from_gguf(const mr_gguf *g, const char *override, size_t override_len,
                                     mr_err *err);

typedef struct mr_chat_req {
    const json_t *messages;    /* array of {role, content, tool_calls, reasoning_content, ...} */
    const json_t *tools;       /* array, or NULL for no tools */
    int add_generation_prompt; /* 0 or 1 */
    int enable_thinking;       /* -1: not set (the variable stays undefined), 0 or 1 */
    const char *reasoning_effort; /* the request's, given to the template; NULL: not set */
    const json_t *kwargs;      /* object of extra template variables, or NULL */
} mr_chat_req;

/* Reads the fields of an OpenAI chat-completions body: messages (required),
 * tools, add_generation_prompt (default true), enable_thinking (top level),
 * chat_template_kwargs.  The pointers borrow from body. */
int mr_chat_req_from_json(const json_t *body, mr_chat_req *req, mr_err *err);

/* The template variables for req (a new reference; validates req).
 * Messages are copied with two normalizations that OpenAI clients need:
 * a null or missing content becomes "" (templates test it with `in` and
 * string methods), and a tool call's arguments given as a JSON string that
 * holds an object become that object (templates iterate `arguments|items`). */
json_t *mr_chat_context(const mr_chat_tmpl *ct, const mr_chat_req *req, mr_err *err);

/* Renders the prompt; *out is malloc'd and NUL-terminated, *out_len bytes.
 * opts may be NULL for the engine's default limits. */
int mr_chat_render(const mr_chat_tmpl *ct, const mr_chat_req *req, const mr_jinja_opts *opts,
                   char **out, size_t *out_len, mr_err *err);

#endif
