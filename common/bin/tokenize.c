/* tokenize: text <-> token ids with a GGUF vocabulary.
 *
 *   tokenize --model M.gguf --text "Hello"           ids, one line
 *   tokenize --model M.gguf --file F                  ids of a file's contents
 *   tokenize --model M.gguf --ids "9707 1879"         decode ids to text
 *   tokenize --model M.gguf --ggml-vocab-test F.inp   one line of ids per test string
 *   tokenize --model M.gguf --file F --time N         encode N times, print MB/s
 *
 * Options: --add-special (BOS/EOS as the model says), --no-parse-special
 * (control tokens in the text are plain text), --show (id and piece per line). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/file.h"
#include "common/tokenizer.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: tokenize --model VOCAB.gguf (--text S | --file F | --ids \"1 2 3\" |\n"
            "                --ggml-vocab-test F.inp) [--add-special] [--no-parse-special]\n"
            "                [--show] [--time N]\n");
}

static int print_ids(const mr_tokens *t)
{
    for (size_t i = 0; i < t->n; i++)
        printf(i ? " %d" : "%d", t->ids[i]);
    putchar('\n');
    return 0;
}

static int show(const mr_tokenizer *tok, const mr_tokens *t)
{
    mr_bytes b = {0};
    mr_err err;
    for (size_t i = 0; i < t->n; i++) {
        b.len = 0;
        if (mr_tok_piece(tok, t->ids[i], MR_DETOK_SPECIAL, &b, &err)) {
            fprintf(stderr, "tokenize: %s\n", err.msg);
            mr_bytes_free(&b);
            return -1;
        }
        printf("%6d '%.*s'\n", t->ids[i], (int)b.len, b.data ? b.data : "");
    }
    mr_bytes_free(&b);
    return 0;
}

static const char SEP[] = "\n__ggml_vocab_test__\n";

int main(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *file = NULL, *ids = NULL, *vt = NULL;
    unsigned flags = MR_TOK_PARSE_SPECIAL;
    int do_show = 0;
    long repeat = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) {
            model = v, i++;
        } else if (!strcmp(a, "--text") && v) {
            text = v, i++;
        } else if (!strcmp(a, "--file") && v) {
            file = v, i++;
        } else if (!strcmp(a, "--ids") && v) {
            ids = v, i++;
        } else if (!strcmp(a, "--ggml-vocab-test") && v) {
            vt = v, i++;
        } else if (!strcmp(a, "--time") && v) {
            repeat = strtol(v, NULL, 10), i++;
        } else if (!strcmp(a, "--add-special")) {
            flags |= MR_TOK_ADD_SPECIAL;
        } else if (!strcmp(a, "--no-parse-special")) {
            flags &= ~(unsigned)MR_TOK_PARSE_SPECIAL;
        } else if (!strcmp(a, "--show")) {
            do_show = 1;
        } else {
            usage();
            return 2;
        }
    }
    if (!model || (!!text + !!file + !!ids + !!vt) != 1) {
        usage();
        return 2;
    }
    mr_err err;
    mr_tokenizer *tok;
    if (mr_tok_load_file(model, &tok, &err)) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    mr_tokens out = {0};
    if (ids) {
        const char *p = ids;
        for (;;) {
            while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n')
                p++;
            if (!*p)
                break;
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < INT32_MIN || v > INT32_MAX) {
                fprintf(stderr, "tokenize: bad id list at '%.20s'\n", p);
                rc = 1;
                break;
            }
            if (out.n == out.cap) {
                size_t cap = out.cap ? out.cap * 2 : 64;
                mr_token *d = realloc(out.ids, cap * sizeof *d);
                if (!d) {
                    rc = 1;
                    break;
                }
                out.ids = d;
                out.cap = cap;
            }
            out.ids[out.n++] = (mr_token)v;
            p = end;
        }
        if (!rc) {
            mr_bytes b = {0};
            if (mr_tok_decode(tok, out.ids, out.n, MR_DETOK_SPECIAL, &b, &err)) {
                fprintf(stderr, "tokenize: %s\n", err.msg);
                rc = 1;
            } else {
                fwrite(b.data ? b.data : "", 1, b.len, stdout);
                putchar('\n');
            }
            mr_bytes_free(&b);
        }
    } else if (text || file) {
        size_t len;
        char *buf = NULL;
        if (file) {
            buf = mr_file_read(file, &len, &err);
            if (!buf) {
                fprintf(stderr, "tokenize: cannot read %s\n", err.msg);
                mr_tok_free(tok);
                return 1;
            }
            text = buf;
        } else {
            len = strlen(text);
        }
        if (repeat > 0) {
            double best = 1e30, total = 0;
            for (long r = 0; r < repeat && !rc; r++) {
                struct timespec a, b;
                out.n = 0;
                clock_gettime(CLOCK_MONOTONIC, &a);
                if (mr_tok_encode(tok, text, len, flags, &out, &err)) {
                    fprintf(stderr, "tokenize: %s\n", err.msg);
                    rc = 1;
                }
                clock_gettime(CLOCK_MONOTONIC, &b);
                double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
                printf("run %ld: %zu bytes, %zu tokens, %.4f s, %.2f MB/s\n", r, len, out.n, s,
                       (double)len / s / 1e6);
                total += s;
                if (s < best)
                    best = s;
            }
        } else if (mr_tok_encode(tok, text, len, flags, &out, &err)) {
            fprintf(stderr, "tokenize: %s\n", err.msg);
            rc = 1;
        } else {
            rc = do_show ? (show(tok, &out) ? 1 : 0) : print_ids(&out);
        }
        free(buf);
    } else {
        size_t len;
        char *buf = mr_file_read(vt, &len, &err);
        if (!buf) {
            fprintf(stderr, "tokenize: cannot read %s\n", err.msg);
            mr_tok_free(tok);
            return 1;
        }
        /* strings are separated by "\n__ggml_vocab_test__\n"; a file that
         * ends with the separator has no string after it */
        size_t pos = 0;
        while (pos <= len && !rc) {
            const char *m = memmem(buf + pos, len - pos, SEP, sizeof SEP - 1);
            size_t end = m ? (size_t)(m - buf) : len;
            if (!m && end == pos)
                break;
            out.n = 0;
            if (mr_tok_encode(tok, buf + pos, end - pos, flags, &out, &err)) {
                fprintf(stderr, "tokenize: %s\n", err.msg);
                rc = 1;
                break;
            }
            print_ids(&out);
            if (!m)
                break;
            pos = end + sizeof SEP - 1;
        }
        free(buf);
    }
    mr_tokens_free(&out);
    mr_tok_free(tok);
    if (fflush(stdout) != 0)
        rc = 1;
    return rc;
}
