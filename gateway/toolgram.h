/* The grammar that keeps tool_choice "required" or a named function: the
 * reply is tool calls only, written as the model's chat template writes
 * them, each call's arguments valid under its tool's parameter schema
 * (gateway/jsonschema.h) once the reply parser (gateway/chatout.h) has read
 * them.  Hermes form (Qwen2.5, Qwen3):
 *
 *   <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
 *
 * qwen3_xml form (Qwen3-Coder, Qwen3.5/3.6):
 *
 *   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n
 *   ...</function>\n</tool_call>
 *
 * where a parameter is one type (or one type and null): a string's VALUE
 * is raw text without "</" (enum / const kept, no other string keyword),
 * the other types' VALUE their schema's JSON; properties in their order,
 * the required ones always.  Calls are separated by one newline when
 * parallel calls are allowed. */
#ifndef MR_TOOLGRAM_H
#define MR_TOOLGRAM_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "gateway/chatout.h"

/* tools: the request's validated "tools"; only: the one function allowed
 * (NULL: any of them); parallel: more than one call may follow.  *text
 * (malloc'd, NUL-terminated) gets the grammar.  Errors name the tool and
 * the place in its schema; a format without a grammar here is an error. */
int mr_tool_grammar(mr_tool_format fmt, const json_t *tools, const char *only, bool parallel, char **text,
                    size_t *len, mr_err *err);

#endif
