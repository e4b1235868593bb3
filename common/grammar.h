/* Grammars that constrain what a model may write (structured output).
 *
 * A grammar is text in the GBNF notation that llama.cpp's `grammar` field
 * and its json-schema converter use, so a client's grammar for one works
 * here unchanged:
 *
 *   root   ::= object              # rules: name ::= alternatives
 *   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
 *   pair   ::= string ":" ws value
 *   string ::= "\"" [^"\\\x00-\x1f]* "\""
 *   ws     ::= [ \t\n]{0,20}
 *
 * - rule names: [a-zA-Z0-9-_]+; the sentence starts at `root`; a rule may
 *   be used before it is defined; every rule used must be defined, once;
 * - alternatives `a | b`, sequences `a b`, groups `( ... )`, the empty
 *   sequence (`x ::= "a" | ` or `()`);
 * - a rule ends at the end of its line, except inside a group, after
 *   `::=` or `|`, or when the next line starts with `|`;
 * - literals "..." with the escapes \n \r \t \\ \" \' \[ \] \xHH \uHHHH
 *   \UHHHHHHHH; characters are Unicode code points written in UTF-8;
 * - classes [a-z0-9_], negated [^...], with the same escapes; `.` is any
 *   code point;
 * - repetition `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` after an element;
 * - comments from `#` to the end of the line.
 * A rule that can reach itself without consuming a byte (left recursion)
 * is an error, as is a grammar larger than the limits below, or one whose
 * root derives no finite text.  Repeating something that may be empty
 * (`("a"?)*`) is fine.
 *
 * Matching is by bytes: a class of code points is compiled to the UTF-8
 * byte sequences of its members, so a token that ends inside a multi-byte
 * character (byte-level BPE has many) is allowed exactly when some
 * completion of it is.  Only valid UTF-8 is ever accepted.
 *
 * The matcher keeps every parse still alive (a set of stacks, so an
 * ambiguous grammar costs more but is correct), and computes which tokens
 * of a vocabulary may come next by walking a trie of their bytes once. */
#ifndef MR_GRAMMAR_H
#define MR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Bounds on what a request may ask for (a grammar is outside input). */
#define MR_GRAMMAR_MAX_TEXT (1u << 20)   /* bytes of grammar text */
#define MR_GRAMMAR_MAX_RULES 65536       /* after repetitions are expanded */
#define MR_GRAMMAR_MAX_REPEAT 10000      /* m and n of {m,n} */
#define MR_GRAMMAR_MAX_NESTING 128       /* groups ( ... ) inside one another */

/* A compiled grammar: immutable, so one may serve many matchers (and
 * threads) at once. */
typedef struct mr_grammar mr_grammar;

/* Parses and compiles text[0..len); err names the line and column of what
 * is wrong. */
int mr_grammar_parse(const char *text, size_t len, mr_grammar **out, mr_err *err);
void mr_grammar_free(mr_grammar *g);

/* A vocabulary as the matcher sees it: each token id's bytes.  A token with
 * no bytes (control tokens, end of sequence) never matches grammar text;
 * the caller decides about those (e.g. allows end of sequence exactly when
 * mr_gmatch_can_end). */
typedef struct mr_gvocab mr_gvocab;

/* pieces[i], lens[i]: token i's bytes (copied); pieces[i] NULL or lens[i]
 * 0: token i never matches. */
int mr_gvocab_new(int n_vocab, const char *const *pieces, const size_t *lens, mr_gvocab **out, mr_err *err);
/* The vocabulary of the 256 single bytes (token i is byte i): a mask over
 * it says which bytes may come next (random walks, byte-level checks). */
int mr_gvocab_new_bytes(mr_gvocab **out, mr_err *err);
void mr_gvocab_free(mr_gvocab *v);
int mr_gvocab_size(const mr_gvocab *v);

/* One sentence being matched, from its start. */
typedef struct mr_gmatch mr_gmatch;

int mr_gmatch_new(const mr_grammar *g, mr_gmatch **out, mr_err *err);
void mr_gmatch_free(mr_gmatch *m);

/* Advances over bytes[0..n) when the grammar allows all of them (some
 * sentence starts with what was accepted so far followed by them): returns
 * true.  Otherwise returns false and leaves m as it was.  An allocation
 * failure also returns false, leaving m as it was, and so does a call that
 * would pass the matcher's bounds on work and memory (a grammar ambiguous
 * enough to keep very many parses alive). */
bool mr_gmatch_accept(mr_gmatch *m, const void *bytes, size_t n);

/* Whether mr_gmatch_accept(m, bytes, n) would return true, without
 * advancing m: a sampler may check its pick and build a mask only when the
 * pick is refused. */
bool mr_gmatch_allows(mr_gmatch *m, const void *bytes, size_t n);

/* Whether what was accepted so far is a whole sentence of the grammar. */
bool mr_gmatch_can_end(const mr_gmatch *m);
/* Whether some byte may still follow (false: the sentence is complete and
 * nothing can extend it). */
bool mr_gmatch_can_continue(const mr_gmatch *m);

/* Sets bit i of mask[(n_vocab + 31) / 32] (bit i % 32 of word i / 32) when
 * token i's bytes may follow what was accepted so far, clears it
 * otherwise.  Token ids without bytes are cleared.  Masks of states met
 * before come from a cache kept in m (a long string or a repeated value
 * meets the same state many times).  -1 on allocation failure or past the
 * matcher's bounds (as for accept), with err saying which. */
int mr_gmatch_mask(mr_gmatch *m, const mr_gvocab *v, uint32_t *mask, mr_err *err);

#endif
