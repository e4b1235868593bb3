/* The text of a chat completion split the way OpenAI clients read it:
 * reasoning ("reasoning_content"), the answer ("content") and tool calls
 * ("tool_calls"), from the markers the model's chat template teaches it:
 *
 *   <think> ... </think>                   reasoning (Qwen3, Qwen3.5/3.6, ...)
 *   <tool_call>{"name": .., "arguments": ..}</tool_call>        "hermes"
 *   <tool_call><function=NAME><parameter=P>V</parameter>...
 *       </function></tool_call>                                 "qwen3_xml"
 *
 * The text arrives in pieces (stop strings already applied, released on
 * UTF-8 boundaries); what could still become a marker is held back, so a
 * streamed response shows exactly what the blocking one holds. */
#ifndef MR_CHATOUT_H
#define MR_CHATOUT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "gateway/util.h"

typedef enum { MR_TOOLS_NONE, MR_TOOLS_HERMES, MR_TOOLS_QWEN_XML } mr_tool_format;

typedef struct mr_chat_format {
    bool think;           /* <think>...</think> is reasoning */
    mr_tool_format tools; /* how tool calls are written */
} mr_chat_format;

/* The format of a model: reasoning ("auto", "think", "none") and tools
 * ("auto", "hermes", "qwen3_xml", "none") from its config; "auto" reads
 * the markers the chat template text uses (tmpl NULL: a ChatML fallback,
 * which has neither). */
int mr_chat_format_resolve(const char *tmpl, const char *reasoning, const char *tools, mr_chat_format *f,
                           mr_err *err);

/* True when a rendered prompt leaves the model inside its reasoning (the
 * generation prompt ends with an open <think>, as Qwen3.5's does). */
bool mr_chat_prompt_opens_think(const mr_chat_format *f, const char *prompt, size_t len);

/* One tool call's text (between <tool_call> and </tool_call>) as
 * {"name": string, "arguments": string of JSON}, or NULL when it is not a
 * call of that format.  tools (the request's "tools", may be NULL) gives
 * the parameter types of the XML format, whose values are text. */
json_t *mr_tool_call_parse(mr_tool_format fmt, const char *s, size_t n, const json_t *tools);

typedef enum { MR_CO_CONTENT, MR_CO_REASONING, MR_CO_TOOL } mr_co_kind;

typedef struct mr_co_event {
    mr_co_kind kind;
    mr_buf text;  /* CONTENT, REASONING */
    json_t *call; /* TOOL: as mr_tool_call_parse gives it (owned) */
} mr_co_event;

/* What one push released, in order; consecutive text of one kind is one
 * event.  mr_co_events_clear keeps the buffers for reuse. */
typedef struct mr_co_events {
    mr_co_event *v;
    size_t n, cap;
} mr_co_events;

void mr_co_events_clear(mr_co_events *e);
void mr_co_events_free(mr_co_events *e);

typedef struct mr_chatout {
    mr_chat_format fmt;
    json_t *tools;  /* the request's tools (a reference), NULL when calls are not parsed */
    bool parallel;  /* false: the calls after the first are dropped */
    bool reasoning; /* false: reasoning is dropped (include_reasoning: false) */
    int state;
    bool strip_nl;  /* drop the newlines that start a section */
    bool strip_ws;  /* drop the whitespace after a tool call */
    mr_buf pending;
    mr_buf gap;     /* the whitespace before an open call (given back if it is not one) */
    size_t scanned; /* bytes of an open call's text already searched for its end */
    size_t n_calls;
} mr_chatout;

/* in_think: the prompt opened the reasoning (mr_chat_prompt_opens_think).
 * tools: the request's tools when calls are to be parsed (a reference is
 * taken), else NULL. */
void mr_chatout_init(mr_chatout *c, const mr_chat_format *f, bool in_think, json_t *tools, bool parallel,
                     bool include_reasoning);
void mr_chatout_push(mr_chatout *c, const char *s, size_t n, mr_co_events *ev);
/* End of the text: what was held back goes out (an unfinished tool call
 * as content). */
void mr_chatout_finish(mr_chatout *c, mr_co_events *ev);
void mr_chatout_free(mr_chatout *c);

#endif
