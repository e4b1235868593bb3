/* run-gen: one generation or a logits dump from the command line.
 *
 *   run-gen MODEL.gguf --tokens 1,2,3 --logits-out FILE   float32 LE [n_tokens][vocab]
 *   --feed 4,5,6: after the prompt, each id as a decode step of its own (the
 *                 path a served request's generated tokens take), their rows
 *                 after the prompt's in --logits-out; generation follows them
 *   --router-out FILE: router logits, float32 LE: the prompt call's
 *                      [moe_layers][n_tokens][n_expert], then each fed id's
 *                      [moe_layers][1][n_expert] (mixture models)
 *   run-gen MODEL.gguf --tokens 1,2,3 -n 24               greedy ids on one line
 *   run-gen MODEL.gguf --prompt "text" -n 24              text and ids
 *   run-gen MODEL.gguf --chat "message" [--system "..."]  the same, as a chat turn
 *   --backend cpu|cuda|auto (default auto), --kv-dtype auto|f32|f16|bf16 (default auto: the backend's, f16 on cuda, f32 on cpu)
 *
 * The prompt is exactly one of --tokens (ids), --prompt (text through the
 * model's tokenizer) or --chat (a user message through the model's chat
 * template, then the tokenizer).  Generation is greedy and stops after an end-of-generation id
 * (when the model has a tokenizer) or after -n ids.  The generated ids are
 * always the last line of stdout; the text, when printed, comes before it.
 *
 * Errors are one line on stderr and a non-zero exit. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/chat.h"
#include "common/tokenizer.h"
#include "worker/cli.h"
#include "worker/sample.h"

static void usage(void)
{
    printf("usage: run-gen MODEL.gguf (--tokens ID,ID,... | --prompt TEXT |\n"
           "               --chat MESSAGE [--system TEXT]) [-n N]\n"
           "               [--feed ID,ID,...] [--logits-out FILE] [--router-out FILE]\n"
           "               [--backend cpu|cuda|auto]\n"
           "               [--kv-dtype auto|f32|f16|bf16]\n"
           "               [--print-text | --no-print-text] [--ignore-eos]\n"
           "  --tokens      prompt token ids, as given (no BOS added)\n"
           "  --feed        ids run after the prompt one decode step each (the kernels of\n"
           "                generation, not of prompts); --logits-out writes their rows\n"
           "                after the prompt's\n"
           "  --prompt      prompt text, tokenized with the model's tokenizer: BOS as the\n"
           "                model's add_bos flag says; special tokens written in the text\n"
           "                (e.g. <|im_start|>) are recognised\n"
           "  --chat        a user message (after the --system message, if given) rendered\n"
           "                with the model's tokenizer.chat_template, add_generation_prompt\n"
           "                true, then tokenized with special tokens recognised (BOS only\n"
           "                where the template writes it)\n"
           "  -n N          generate at most N ids (default 24)\n"
           "  --print-text  also print the generated text (default with --prompt, --chat)\n"
           "  --ignore-eos  do not stop at end-of-generation ids\n"
           "  --router-out  write the router logits of every mixture layer: the prompt's,\n"
           "                float32 [layers][tokens][experts], then each fed id's\n"
           "                [layers][1][experts] (nothing for dense models)\n");
}

static int write_logits(const char *path, const float *logits, size_t count, mr_err *err)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return mr_errf(err, "%s: cannot open for writing: %s", path, strerror(errno));
    /* float32 little-endian: the in-memory layout on every host we build for */
    size_t wrote = fwrite(logits, sizeof(float), count, f);
    int rc = fclose(f);
    if (wrote != count || rc)
        return mr_errf(err, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

/* Opens the model file's tokenizer (text modes and --print-text need it). */
static int open_tokenizer(const char *path, mr_gguf **g, mr_tokenizer **tok, mr_err *err)
{
    if (mr_gguf_open(path, g, err))
        return -1;
    if (mr_tok_load(*g, tok, err))
        return mr_err_wrap(err, "%s: the model has no usable tokenizer", path);
    return 0;
}

/* Tokenizes --prompt text as upstream does for a raw prompt: BOS/EOS as the
 * model's flags say, special tokens written in the text recognised. */
static int encode_prompt(const mr_tokenizer *tok, const char *text, int32_t **out, int *n_out,
                         mr_err *err)
{
    mr_tokens ids = {0};
    if (mr_tok_encode(tok, text, strlen(text), MR_TOK_ADD_SPECIAL | MR_TOK_PARSE_SPECIAL, &ids, err))
        return mr_err_wrap(err, "--prompt");
    if (ids.n == 0 || ids.n > INT_MAX) {
        mr_tokens_free(&ids);
        return mr_errf(err, "--prompt: the text gives %s tokens", ids.n ? "too many" : "no");
    }
    *out = ids.ids; /* mr_tokens' ids are plain malloc'd mr_token (int32_t) */
    *n_out = (int)ids.n;
    return 0;
}

/* Renders the chat prompt of one user message (after an optional system
 * message) with the model's template and tokenizes it.  The template writes
 * whatever BOS the model wants, so none is added (as transformers'
 * apply_chat_template does). */
static int encode_chat(const mr_gguf *g, const mr_tokenizer *tok, const char *system,
                       const char *user, int32_t **out, int *n_out, mr_err *err)
{
    int rc = -1;
    char *text = NULL;
    size_t len = 0;
    mr_tokens ids = {0};
    json_t *messages = json_array();
    mr_chat_tmpl *ct = NULL;
    if (!messages || (system && json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "system",
                                                                          "content", system))) ||
        json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "user", "content", user))) {
        mr_errf(err, "--chat: the message is not valid UTF-8 (or out of memory)");
        goto out;
    }
    if (!mr_gguf_find(g, "tokenizer.chat_template")) {
        mr_errf(err, "--chat: the model has no chat template (tokenizer.chat_template)");
        goto out;
    }
    if (!(ct = mr_chat_tmpl_from_gguf(g, NULL, 0, err))) {
        mr_err_wrap(err, "--chat");
        goto out;
    }
    mr_chat_req req = {.messages = messages, .add_generation_prompt = 1, .enable_thinking = -1};
    if (mr_chat_render(ct, &req, NULL, &text, &len, err)) {
        mr_err_wrap(err, "--chat: rendering the chat template");
        goto out;
    }
    if (mr_tok_encode(tok, text, len, MR_TOK_PARSE_SPECIAL, &ids, err)) {
        mr_err_wrap(err, "--chat");
        goto out;
    }
    if (ids.n == 0 || ids.n > INT_MAX) {
        mr_errf(err, "--chat: the rendered prompt gives %s tokens", ids.n ? "too many" : "no");
        goto out;
    }
    *out = ids.ids;
    *n_out = (int)ids.n;
    ids.ids = NULL;
    rc = 0;
out:
    mr_tokens_free(&ids);
    free(text);
    mr_chat_tmpl_free(ct);
    json_decref(messages);
    return rc;
}

/* Writes what the detokenizer produced so far (stdout is flushed so that the
 * text streams as it is generated). */
static int put_text(mr_bytes *b, bool *ends_nl, mr_err *err)
{
    if (!b->len)
        return 0;
    size_t n = b->len;
    *ends_nl = b->data[n - 1] == '\n';
    b->len = 0;
    if (fwrite(b->data, 1, n, stdout) != n || fflush(stdout))
        return mr_errf(err, "writing the text to stdout: %s", strerror(errno));
    return 0;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *tokens_arg = NULL, *feed_arg = NULL, *logits_out = NULL, *router_out = NULL,
               *backend = "auto";
    mr_kv_dtype kv_dtype = MR_KV_AUTO;
    const char *prompt_text = NULL, *chat_text = NULL, *system_text = NULL;
    int n_gen = -1, print_text = -1; /* -1: the default of the prompt kind */
    bool ignore_eos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "--tokens") && has_val) {
            tokens_arg = argv[++i];
        } else if (!strcmp(a, "--feed") && has_val) {
            feed_arg = argv[++i];
        } else if (!strcmp(a, "--prompt") && has_val) {
            prompt_text = argv[++i];
        } else if (!strcmp(a, "--chat") && has_val) {
            chat_text = argv[++i];
        } else if (!strcmp(a, "--system") && has_val) {
            system_text = argv[++i];
        } else if (!strcmp(a, "--logits-out") && has_val) {
            logits_out = argv[++i];
        } else if (!strcmp(a, "--router-out") && has_val) {
            router_out = argv[++i];
        } else if (!strcmp(a, "--backend") && has_val) {
            backend = argv[++i];
        } else if (!strcmp(a, "--kv-dtype") && has_val) {
            if (mr_cli_parse_kv_dtype(argv[++i], &kv_dtype)) {
                fprintf(stderr, "run-gen: --kv-dtype: expected auto, f32, f16 or bf16, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--print-text")) {
            print_text = 1;
        } else if (!strcmp(a, "--no-print-text")) {
            print_text = 0;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
        } else if (!strcmp(a, "-n") && has_val) {
            if (mr_cli_parse_int(argv[++i], 0, 1000000, &n_gen)) {
                fprintf(stderr, "run-gen: -n: expected a count in [0, 1000000], got '%s'\n", argv[i]);
                return 2;
            }
        } else if (a[0] == '-') {
            fprintf(stderr, "run-gen: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        } else if (!model_path) {
            model_path = a;
        } else {
            fprintf(stderr, "run-gen: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    int n_sources = !!tokens_arg + !!prompt_text + !!chat_text;
    if (!model_path || n_sources == 0) {
        fprintf(stderr, "run-gen: a model path and one of --tokens, --prompt or --chat are "
                        "required (see --help)\n");
        return 2;
    }
    if (n_sources > 1) {
        fprintf(stderr, "run-gen: --tokens, --prompt and --chat are alternatives: give one prompt\n");
        return 2;
    }
    if (system_text && !chat_text) {
        fprintf(stderr, "run-gen: --system goes with --chat\n");
        return 2;
    }
    if (!logits_out && n_gen < 0)
        n_gen = 24;
    if (print_text < 0)
        print_text = !tokens_arg;

    mr_err err = {{0}};
    int32_t *prompt = NULL, *feed = NULL;
    int n_prompt = 0, n_feed = 0;
    if (tokens_arg && mr_cli_parse_tokens("--tokens", tokens_arg, &prompt, &n_prompt, &err)) {
        fprintf(stderr, "run-gen: %s\n", err.msg);
        return 2;
    }
    if (feed_arg && mr_cli_parse_tokens("--feed", feed_arg, &feed, &n_feed, &err)) {
        fprintf(stderr, "run-gen: %s\n", err.msg);
        free(prompt);
        return 2;
    }

    int status = 1;
    mr_gguf *g = NULL;
    mr_tokenizer *tok = NULL;
    mr_detok_stream *ds = NULL;
    mr_bytes text = {0};
    mr_backend *be = NULL;
    mr_model *m = NULL;
    mr_seq *s = NULL;
    float *logits = NULL;
    int32_t *gen = NULL;
    FILE *rf = NULL; /* --router-out */
    if (!tokens_arg || print_text) {
        if (open_tokenizer(model_path, &g, &tok, &err))
            goto fail;
    } else if (!ignore_eos && n_gen > 0 && mr_gguf_open(model_path, &g, &err) == 0) {
        /* ids in, ids out: the tokenizer only tells where generation ends, and
         * a model without one still runs (the loader reports a bad file) */
        if (mr_tok_load(g, &tok, &err)) {
            tok = NULL;
            err = (mr_err){{0}};
        }
    }
    if (prompt_text && encode_prompt(tok, prompt_text, &prompt, &n_prompt, &err))
        goto fail;
    if (chat_text && encode_chat(g, tok, system_text, chat_text, &prompt, &n_prompt, &err))
        goto fail;
    mr_gguf_close(g);
    g = NULL;
    if (print_text && !(ds = mr_detok_stream_new(tok, 0))) {
        mr_errf(&err, "out of memory");
        goto fail;
    }

    mr_model_opts opts = {.n_ctx = n_prompt + n_feed + (n_gen > 0 ? n_gen : 0), .n_seqs = 1, .kv_dtype = kv_dtype};
    if (mr_cli_load(model_path, backend, &opts, &be, &m, &err))
        goto fail;
    const mr_hparams *hp = mr_model_hparams(m);
    if (mr_seq_new(m, &s, &err))
        goto fail;
    /* rows: the prompt's (all of them for --logits-out), then one a fed id */
    const size_t rows = (size_t)n_prompt + (size_t)n_feed;
    logits = malloc(sizeof(float) * rows * (size_t)hp->n_vocab);
    gen = malloc(sizeof(int32_t) * (size_t)(n_gen > 0 ? n_gen : 1));
    if (!logits || !gen) {
        mr_errf(&err, "out of memory");
        goto fail;
    }
    if (router_out && !(rf = fopen(router_out, "wb"))) {
        mr_errf(&err, "%s: cannot open for writing: %s", router_out, strerror(errno));
        goto fail;
    }
    if (rf)
        mr_model_router_dump(m, rf, NULL);
    if (mr_model_forward(m, s, prompt, n_prompt, logits_out ? MR_LOGITS_ALL : MR_LOGITS_LAST, logits, &err))
        goto fail;
    /* the fed ids' rows follow the prompt's last row (row 0 without
     * --logits-out, which keeps only the last); the router dump goes on
     * through them (decode steps take other kernels than the prompt) */
    const size_t row0 = logits_out ? (size_t)n_prompt : 1;
    for (int i = 0; i < n_feed; i++)
        if (mr_model_forward_gen(m, s, &feed[i], 1, MR_LOGITS_LAST, logits + (row0 + i) * (size_t)hp->n_vocab,
                                 &err))
            goto fail;
    if (rf) {
        const int dumped = mr_model_router_dump(m, NULL, &err);
        const int closed = fclose(rf);
        rf = NULL;
        if (dumped)
            goto fail;
        if (closed) {
            mr_errf(&err, "%s: write failed: %s", router_out, strerror(errno));
            goto fail;
        }
    }
    if (logits_out && write_logits(logits_out, logits, rows * (size_t)hp->n_vocab, &err))
        goto fail;
    if (n_gen > 0) {
        const float *last = logits + (row0 + n_feed - 1) * (size_t)hp->n_vocab;
        int32_t next = mr_sample_argmax(last, hp->n_vocab);
        int n_done = 0;
        bool ends_nl = true;
        for (int i = 0; i < n_gen; i++) {
            gen[n_done++] = next;
            /* the end id itself is listed (as transformers' generate does) but not printed */
            if (!ignore_eos && tok && mr_tok_is_eog(tok, next))
                break;
            if (ds && (mr_detok_stream_push(ds, next, &text, &err) || put_text(&text, &ends_nl, &err)))
                goto fail;
            if (i + 1 < n_gen) {
                if (mr_model_forward_gen(m, s, &next, 1, MR_LOGITS_LAST, logits, &err))
                    goto fail;
                next = mr_sample_argmax(logits, hp->n_vocab);
            }
        }
        if (ds) {
            if (mr_detok_stream_flush(ds, &text, &err) || put_text(&text, &ends_nl, &err))
                goto fail;
            if (!ends_nl)
                printf("\n");
        }
        for (int i = 0; i < n_done; i++)
            printf(i ? " %d" : "%d", gen[i]);
        printf("\n");
    }
    status = 0;
fail:
    if (status)
        fprintf(stderr, "run-gen: %s\n", err.msg);
    if (rf)
        fclose(rf);
    free(gen);
    free(logits);
    mr_seq_free(s);
    mr_model_free(m);
    mr_backend_destroy(be);
    mr_detok_stream_free(ds);
    mr_bytes_free(&text);
    mr_tok_free(tok);
    mr_gguf_close(g);
    free(prompt);
    free(feed);
    return status;
}
