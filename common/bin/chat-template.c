/* chat-template --template FILE.jinja --context CONTEXT.json
 * Prints the template rendered with the variables of CONTEXT.json exactly
 * (no newline added).  A syntax error or a raised exception exits 1 with the
 * message on stderr. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja.h"

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return NULL;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static int usage(void)
{
    fprintf(stderr, "usage: chat-template --template FILE.jinja --context CONTEXT.json\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *tpath = NULL, *cpath = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--template") && i + 1 < argc)
            tpath = argv[++i];
        else if (!strcmp(argv[i], "--context") && i + 1 < argc)
            cpath = argv[++i];
        else
            return usage();
    }
    if (!tpath || !cpath)
        return usage();
    size_t tlen;
    char *src = read_file(tpath, &tlen);
    if (!src) {
        fprintf(stderr, "chat-template: cannot read %s\n", tpath);
        return 1;
    }
    json_error_t jerr;
    json_t *ctx = json_load_file(cpath, JSON_ALLOW_NUL, &jerr);
    if (!ctx || !json_is_object(ctx)) {
        fprintf(stderr, "chat-template: %s: %s\n", cpath, ctx ? "not a JSON object" : jerr.text);
        json_decref(ctx);
        free(src);
        return 1;
    }
    mr_err err = {{0}};
    mr_jinja_tmpl *t = mr_jinja_parse(src, tlen, &err);
    free(src);
    if (!t) {
        fprintf(stderr, "chat-template: %s: %s\n", tpath, err.msg);
        json_decref(ctx);
        return 1;
    }
    char *out;
    size_t out_len;
    int rc = mr_jinja_render(t, ctx, NULL, &out, &out_len, &err);
    mr_jinja_free(t);
    json_decref(ctx);
    if (rc != 0) {
        fprintf(stderr, "chat-template: %s: %s\n", tpath, err.msg);
        return 1;
    }
    fwrite(out, 1, out_len, stdout);
    free(out);
    return fflush(stdout) == 0 ? 0 : 1;
}
