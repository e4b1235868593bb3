/* Turns the bytes of generated tokens into the text a client sees: invalid
 * UTF-8 becomes U+FFFD, stop strings are matched on that text and cut (the
 * stop string itself is never shown; with several, the match that ends
 * first), a suffix that could still become a stop string is held back so
 * streamed text never shows a partial stop, and text is released only on
 * character boundaries.  The text does not depend on how the bytes are
 * split into pushes. */
#ifndef MR_TEXTOUT_H
#define MR_TEXTOUT_H

#include <stdbool.h>

#include "gateway/util.h"

#define MR_MAX_STOPS 8
#define MR_MAX_STOP_LEN 256

typedef struct mr_textout {
    mr_buf raw;     /* the start of a character whose bytes are still coming */
    mr_buf pending; /* valid text held back: it may still become a stop */
    char *stops[MR_MAX_STOPS];
    size_t stop_len[MR_MAX_STOPS];
    size_t n_stops;
    bool stopped;
} mr_textout;

void mr_textout_init(mr_textout *t);
/* Copies the stop string (1..MR_MAX_STOP_LEN bytes of valid UTF-8; others
 * are ignored). */
void mr_textout_add_stop(mr_textout *t, const char *s);
/* Adds bytes; appends the text that can be released now to out.  Returns
 * true once a stop string matched (everything after it is dropped). */
bool mr_textout_push(mr_textout *t, const char *bytes, size_t n, mr_buf *out);
/* End of generation: releases what was held back.  Returns true when a stop
 * string matched (also one completed only now, by a cut-off character
 * becoming U+FFFD). */
bool mr_textout_finish(mr_textout *t, mr_buf *out);
void mr_textout_free(mr_textout *t);

#endif
