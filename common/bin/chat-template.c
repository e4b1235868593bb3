/* chat-template --template FILE.jinja --context CONTEXT.json
 * Prints the template rendered with the variables of CONTEXT.json exactly
 * (no newline added).  A syntax error or a raised exception exits 1 with the
 * message on stderr.
 *
 * chat-template --model MODEL.gguf ... uses the model's tokenizer.chat_template
 * instead of a file; --print-template prints that template text.
 *
 * chat-template --template FILE.jinja --batch CONTEXT_DIR OUT_DIR
 * Renders every CONTEXT_DIR/NAME.json into OUT_DIR/NAME.txt, or writes the
 * error message to OUT_DIR/NAME.err (the test suite's bulk mode). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>

#include "common/file.h"
#include "common/gguf.h"
#include "common/jinja.h"

static int usage(void)
{
    fprintf(stderr, "usage: chat-template --template FILE.jinja --context CONTEXT.json\n"
                    "       chat-template --template FILE.jinja --batch CONTEXT_DIR OUT_DIR\n"
                    "       (--model MODEL.gguf instead of --template: the model's template;\n"
                    "        chat-template --model MODEL.gguf --print-template)\n");
    return 2;
}

static int write_file(const char *dir, const char *name, const char *ext, const char *data,
                      size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s%s", dir, name, ext);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, len, f);
    return (fclose(f) == 0 && w == len) ? 0 : -1;
}

/* Renders one context file; returns 0, or -1 with err filled. */
static int render_file(const mr_jinja_tmpl *t, const char *cpath, char **out, size_t *out_len,
                       mr_err *err)
{
    json_error_t jerr;
    json_t *ctx = json_load_file(cpath, JSON_ALLOW_NUL, &jerr);
    if (!ctx || !json_is_object(ctx)) {
        mr_errf(err, "%s: %s", cpath, ctx ? "not a JSON object" : jerr.text);
        json_decref(ctx);
        return -1;
    }
    int rc = mr_jinja_render(t, ctx, NULL, out, out_len, err);
    json_decref(ctx);
    return rc;
}

static int batch(const mr_jinja_tmpl *t, const char *parse_error, const char *cdir,
                 const char *odir)
{
    DIR *d = opendir(cdir);
    if (!d) {
        fprintf(stderr, "chat-template: cannot open %s\n", cdir);
        return 1;
    }
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0)
            continue;
        char base[1024], cpath[4096];
        snprintf(base, sizeof base, "%.*s", (int)(n - 5), e->d_name);
        snprintf(cpath, sizeof cpath, "%s/%s", cdir, e->d_name);
        mr_err err = {{0}};
        char *out = NULL;
        size_t out_len = 0;
        int r = parse_error ? mr_errf(&err, "%s", parse_error)
                            : render_file(t, cpath, &out, &out_len, &err);
        int w = r == 0 ? write_file(odir, base, ".txt", out, out_len)
                       : write_file(odir, base, ".err", err.msg, strlen(err.msg));
        free(out);
        if (w != 0) {
            fprintf(stderr, "chat-template: cannot write into %s\n", odir);
            rc = 1;
            break;
        }
    }
    closedir(d);
    return rc;
}

static char *model_template;

int main(int argc, char **argv)
{
    const char *tpath = NULL, *cpath = NULL, *bdir = NULL, *odir = NULL, *mpath = NULL;
    int print = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--template") && i + 1 < argc) {
            tpath = argv[++i];
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            mpath = argv[++i];
        } else if (!strcmp(argv[i], "--print-template")) {
            print = 1;
        } else if (!strcmp(argv[i], "--context") && i + 1 < argc) {
            cpath = argv[++i];
        } else if (!strcmp(argv[i], "--batch") && i + 2 < argc) {
            bdir = argv[++i];
            odir = argv[++i];
        } else {
            return usage();
        }
    }
    if (!tpath == !mpath || (!print && !cpath == !bdir) || (print && !mpath))
        return usage();
    if (mpath) {
        /* the template text comes from the model: read it, then go on as with a file */
        mr_gguf *g;
        mr_err gerr = {{0}};
        if (mr_gguf_open(mpath, &g, &gerr) != 0) {
            fprintf(stderr, "chat-template: %s\n", gerr.msg);
            return 1;
        }
        char *tsrc;
        if (mr_gguf_get_str(g, "tokenizer.chat_template", &tsrc, &gerr) != 0) {
            fprintf(stderr, "chat-template: %s: %s\n", mpath, gerr.msg);
            mr_gguf_close(g);
            return 1;
        }
        mr_gguf_close(g);
        if (print) {
            fputs(tsrc, stdout);
            free(tsrc);
            return fflush(stdout) == 0 ? 0 : 1;
        }
        model_template = tsrc;
        tpath = mpath;
    }
    if (bdir) {
        size_t n;
        mr_err ferr = {{0}};
        char *s = model_template ? strdup(model_template) : mr_file_read(tpath, &n, &ferr);
        if (s && model_template)
            n = strlen(s);
        if (!s) {
            fprintf(stderr, "chat-template: cannot read %s\n", model_template ? tpath : ferr.msg);
            return 1;
        }
        mr_err perr = {{0}};
        mr_jinja_tmpl *t = mr_jinja_parse(s, n, &perr);
        free(s);
        int rc = batch(t, t ? NULL : perr.msg, bdir, odir);
        mr_jinja_free(t);
        free(model_template);
        return rc;
    }
    size_t tlen = model_template ? strlen(model_template) : 0;
    mr_err ferr = {{0}};
    char *src = model_template ? model_template : mr_file_read(tpath, &tlen, &ferr);
    if (!src) {
        fprintf(stderr, "chat-template: cannot read %s\n", ferr.msg);
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
