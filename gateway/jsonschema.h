/* JSON Schema -> grammar (common/grammar.h) for structured output:
 * response_format json_object / json_schema and tool calls whose arguments
 * must follow a tool's parameter schema.
 *
 * The one property everything here keeps is soundness: every sentence of a
 * produced grammar is a JSON text that the schema validates (draft 2020-12
 * semantics; draft-07 where the schema's "$schema" says draft-07 or
 * earlier).  What the converter cannot enforce it refuses, with an error
 * that names the place in the schema (a JSON pointer) and the keyword, e.g.
 *
 *   response_format.json_schema.schema: /properties/age: keyword
 *   "multipleOf" is not supported (only 1)
 *
 * Completeness is best effort: a grammar may leave out valid texts (see
 * below), never let an invalid one through.
 *
 * Supported:
 * - type (one or an array; "nullable": true beside "type" adds null),
 *   enum and const (any JSON values);
 * - properties / required / additionalProperties (false, true or a
 *   schema); unevaluatedProperties and unevaluatedItems, counting as
 *   evaluated what the schema and the schemas it brings in through allOf,
 *   $ref and anyOf/oneOf name (exact, or stricter where a branch not taken
 *   would have evaluated more);
 * - items / prefixItems / additionalItems (items as an array is a tuple,
 *   as in draft-07; where "$schema" says draft-07, items as a schema
 *   applies to every item, and prefixItems and unevaluated* are no
 *   keywords), minItems / maxItems;
 * - minLength / maxLength, counted in code points as validators count;
 * - pattern: ECMAScript with the u flag, as ajv runs it: literals,
 *   escapes (\d \w \s and negations, \t \n \r \f \v \0 \cX \xHH \uHHHH
 *   \u{...}), classes, ".", groups (plain, (?:...), named), alternation,
 *   greedy and lazy quantifiers, ^ and $ at the ends of the top-level
 *   alternatives; beside minLength/maxLength only where the pattern implies
 *   them or has one alternative with a repeated class at its top level
 *   (whose count takes the bounds; a pattern not anchored at the start is
 *   then matched at the start, one not anchored at the end ends with any
 *   characters);
 * - format date, time, date-time (RFC 3339 as ajv-formats checks it: "T",
 *   a time zone "Z" or +hh:mm), uuid, ipv4, ipv6 (the full form of eight
 *   groups), hostname (up to three labels), email (a dotted local part
 *   and a domain of labels), duration (ISO 8601), uri (http and https
 *   URLs with a host of labels): each written as a part of what
 *   ajv-formats accepts; lengths beside them only where the format
 *   implies them;
 * - minimum / maximum / exclusiveMinimum / exclusiveMaximum: any bounds on
 *   integers, whole bounds on numbers; multipleOf 1;
 * - anyOf; oneOf where no value can match two branches (they differ in
 *   type, in const/enum values, or in a required property's const/enum
 *   values, as discriminated unions do); allOf (merged exactly: types,
 *   bounds and enums intersected, each property and item position under
 *   the schemas of all); at most 256 combinations of the branches of
 *   several anyOf/oneOf at one place;
 * - $ref to "#" and JSON pointers "#/..." inside the schema (also written
 *   after the root's $id), recursion included: a set of schemas reached
 *   through $ref is one rule; keywords beside a $ref apply too;
 * - minProperties / maxProperties where the required / allowed properties
 *   imply them;
 * - uniqueItems: where the items allow at most 32 values (an enum, a
 *   const), arrays of distinct ones in the order listed; otherwise arrays
 *   of at most one item (refused where minItems asks for more).
 * Refused (each by name): not, if/then/else, dependentSchemas,
 * dependentRequired, dependencies, patternProperties, propertyNames,
 * contains, minContains, maxContains, $dynamicRef, $recursiveRef, $id
 * below the root, multipleOf other than 1, bounds with a fraction on
 * numbers, boolean exclusiveMinimum/Maximum (draft-04), $refs outside the
 * schema or to anchors, a $ref cycle that never enters an object or array,
 * a recursion that allows no finite value, pattern with lookaround,
 * backreferences, \b or \p{...}, two patterns or a pattern beside a
 * format, uniqueItems that needs two items the grammar cannot keep apart,
 * minProperties / maxProperties that the properties do not imply,
 * minLength / minItems above 100000, schemas nested more than 64 deep,
 * enum values nested too deep to check against other keywords, and a
 * schema whose compilation takes too many steps or whose grammar is too
 * large.
 * Ignored: annotations (title, description, default, examples, $comment,
 * deprecated, readOnly, discriminator, x-..., format values other than
 * those above, ...) and keywords that no JSON Schema draft defines:
 * validators ignore them too.
 *
 * What the grammars produce (all of it valid JSON):
 * - between tokens inside objects and arrays, at most one space or one
 *   newline with up to 20 spaces/tabs of indentation; none around the
 *   top-level value;
 * - properties in the order "properties" lists them (a schema brought in
 *   by allOf or $ref before the one bringing it), each at most once;
 *   required ones always, optional ones may be left out; then, where
 *   additionalProperties / unevaluatedProperties is true or a schema,
 *   other members whose keys (written without escapes) are none of the
 *   named ones; where neither is said, no other members when the schema
 *   names properties, any members when it names none;
 * - numbers: at most 16 integer digits, 16 fraction digits and a 2-digit
 *   exponent; integers without fraction or exponent; bounded numbers
 *   without exponent and with a fraction that does not end in 0;
 * - strings: any characters, control characters escaped; \u escapes only
 *   of non-surrogates (each counts one code point), and where a pattern or
 *   format constrains a string only the canonical escapes (\" \\ \b \f \n
 *   \r \t \u00xx of other control characters); maxLength and maxItems
 *   above 100000 are written as 100000;
 * - enum and const values written as JSON.stringify writes them, with the
 *   same whitespace as above inside arrays and objects.
 *
 * Names: the rules made for a schema added as NAME are NAME and NAME-N;
 * names beginning with "json-" are the builder's shared rules (json-ws,
 * json-string, json-value, ...), which a composed rule may use. */
#ifndef MR_JSONSCHEMA_H
#define MR_JSONSCHEMA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "gateway/util.h"

/* The whitespace rule a composed rule may put between JSON tokens. */
#define MR_JSG_WS "json-ws"

/* A grammar under construction: schemas and the caller's own rules, which
 * may refer to one another.  Never shared between threads. */
typedef struct mr_jsgram mr_jsgram;

mr_jsgram *mr_jsgram_new(void);
void mr_jsgram_free(mr_jsgram *g);

/* Defines rule `name` as the JSON texts the schema validates (the value
 * alone, no whitespace around it); helper rules are named name-N.
 * `where` prefixes error messages (e.g. "tools[0].function.parameters").
 * On error nothing is added and err says what and where. */
int mr_jsgram_add_schema(mr_jsgram *g, const char *name, const json_t *schema, const char *where, mr_err *err);

/* Defines rule `name` as any JSON object / any JSON value. */
int mr_jsgram_add_object(mr_jsgram *g, const char *name, mr_err *err);
int mr_jsgram_add_value(mr_jsgram *g, const char *name, mr_err *err);

/* Defines rule `name ::= body`: GBNF alternatives on one line that may use
 * the rules added so far or later and the shared json-... rules (build
 * literals with mr_gbnf_literal).  Names are [a-zA-Z0-9-_]+, at most 100
 * bytes, not json-..., each defined once.  The body is checked when the
 * grammar is finished. */
int mr_jsgram_add_rule(mr_jsgram *g, const char *name, const char *body, mr_err *err);

/* The whole grammar text (NUL-terminated, malloc'd, *len without the NUL):
 * every rule added and the shared rules they use.  Fails when no rule is
 * named root, the text would reach MR_GRAMMAR_MAX_TEXT, or the engine
 * refuses it (it is compiled once here, e.g. for rules after expansion
 * beyond MR_GRAMMAR_MAX_RULES or a rule used and not defined). */
int mr_jsgram_finish(mr_jsgram *g, char **text, size_t *len, mr_err *err);

/* Appends bytes s[0..n) as one GBNF literal "..." (escapes where needed).
 * -1 when s is not valid UTF-8: the grammar matches only valid UTF-8. */
int mr_gbnf_literal(mr_buf *out, const void *s, size_t n, mr_err *err);

/* Whole grammars whose root is the value: of a schema, of any JSON object
 * (json_object mode), of any JSON value.  *text as mr_jsgram_finish. */
int mr_json_schema_grammar(const json_t *schema, const char *where, char **text, size_t *len, mr_err *err);
int mr_json_object_grammar(char **text, size_t *len, mr_err *err);
int mr_json_value_grammar(char **text, size_t *len, mr_err *err);

/* ---- between gateway/jsonschema.c and gateway/jsonschema_regex.c ---- */

#define MR_JSG_INF SIZE_MAX      /* no upper bound */
#define MR_JSG_MAX_COUNT 100000u /* larger maxLength/maxItems are lowered to it, larger minima refused */

/* Appends `elem{lo,hi}` (hi MR_JSG_INF: no bound) as one element, large
 * counts split so that the engine's expansion of them stays small; hi above
 * MR_JSG_MAX_COUNT is lowered to it.  lo <= hi, lo <= MR_JSG_MAX_COUNT. */
void mr_jsg_repeat(mr_buf *out, const char *elem, size_t lo, size_t hi);

/* Appends one element for the contents (between the quotes, canonical
 * escapes, json-cchar for "any character") of the JSON strings whose value
 * the ECMAScript pattern (u flag) matches and whose length in code points
 * is in [min_len, max_len]; *empty (nothing appended) when there are none.
 * Errors say what of the pattern is not supported ("pattern: ..."). */
int mr_jsg_pattern(mr_buf *out, const char *pattern, size_t min_len, size_t max_len, bool *empty, mr_err *err);

#endif
