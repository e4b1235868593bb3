/* A Jinja template engine for chat templates, over jansson values.
 *
 * The reference for every behaviour is the npm package @huggingface/jinja
 * (what our tests compare against byte for byte): its whitespace handling
 * (trim_blocks and lstrip_blocks on, one trailing newline of the template
 * dropped, {% generation %} tags removed), its value model (none renders as
 * nothing, true renders as "true", tojson uses ", " and ": " separators and
 * does not escape non-ASCII by default), and its scoping (a macro sees the
 * variables of the place it is called from).  Where Python jinja2 differs,
 * the reference wins; where the reference raises an error for something that
 * jinja2 supports (a few filters and methods), this engine does what jinja2
 * does.  Each such place is marked "divergence" in the sources:
 *  - jinja2 features the reference lacks: list.append, str.join/find/count,
 *    map('filter'), select/reject with a test, test arguments
 *    (`is divisibleby(3)`, `is sameas x`), {% raw %}, and the filters count,
 *    wordcount, e/escape, round, first/last/list on strings, list on dicts;
 *  - strings are UTF-8: s[i] counts code points (the reference: UTF-16 units;
 *    slices and |length agree with it);
 *  - division or modulo by zero and integer overflow are errors (the
 *    reference computes Infinity/NaN); a lone \uD800-style escape is U+FFFD;
 *  - tojson(sort_keys=true) orders keys like localeCompare for ASCII keys;
 *    lower() does not apply the final-sigma rule;
 *  - break/continue inside a macro called from a loop is an error.
 *
 * Errors (syntax or runtime) come back as mr_err "line L, col C: message";
 * no input crashes the engine.  Memory, output size, nesting depth and work
 * are bounded by mr_jinja_opts. */
#ifndef MR_JINJA_H
#define MR_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct mr_jinja_tmpl mr_jinja_tmpl;

typedef struct mr_jinja_opts {
    size_t max_output;  /* bytes of rendered text (and of any one string) */
    size_t max_memory;  /* bytes the render may allocate in total */
    unsigned max_depth; /* nesting of calls, blocks and expressions */
    uint64_t max_steps; /* evaluation steps (bounds loops) */
    int64_t now;        /* strftime_now's clock (seconds since epoch); <0: time() */
} mr_jinja_opts;

/* Defaults: 64 MiB output, 256 MiB memory, depth 1024, 20M steps (a few
 * seconds of work at most), real clock.  A render uses a few times the size
 * of its variables in memory; depth 1024 needs well under 1 MiB of stack. */
void mr_jinja_opts_default(mr_jinja_opts *o);

/* Parses a template.  Returns NULL with err filled on a syntax error. */
mr_jinja_tmpl *mr_jinja_parse(const char *src, size_t len, mr_err *err);
void mr_jinja_free(mr_jinja_tmpl *t);

/* Renders with the members of vars (a JSON object) as variables, next to the
 * globals namespace, range, raise_exception, strftime_now, true/false/none
 * (and True/False/None).  On success *out is a malloc'd NUL-terminated string
 * of *out_len bytes (the text may itself contain NUL bytes).  opts may be
 * NULL for the defaults.  raise_exception('msg') fails with "...: msg". */
int mr_jinja_render(const mr_jinja_tmpl *t, const json_t *vars, const mr_jinja_opts *opts,
                    char **out, size_t *out_len, mr_err *err);

#endif
