/* Constrained decoding in the scheduler (worker/constrain.h, the grammar
 * field of mr_request) on the Qwen3 fixture and its real tokenizer:
 * - a greedy grammar request gives the tokens of an independent loop that
 *   picks, each step, the best id whose bytes a fresh copy of the match
 *   accepts (brute force over the whole vocabulary, no mask, no trie);
 * - what every request writes, greedy or sampled, alone or batched, is a
 *   sentence of its grammar: jansson parses the JSON ones, the others are
 *   checked by hand; a grammar that nothing can extend ends the request
 *   (finish "stop") without a stop id;
 * - a grammar request's output does not depend on its batchmates;
 * - refusals: a malformed grammar, a scheduler without a vocabulary. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer.h"
#include "kernels/cpu/cpu.h"
#include "tests/unit/fixture_ref.h"
#include "tests/unit/sched_sink.h"
#include "worker/constrain.h"
#include "worker/sched.h"

static mr_tokenizer *tok;
static mr_constrain_vocab *vocab;
static int V;

static void open_all(void)
{
    mr_model_opts mo = {.n_ctx = 160, .n_seqs = 8, .block_tokens = 8};
    open_model("qwen3", "model-BF16.gguf", &mo);
    V = mr_model_hparams(model)->n_vocab;
    mr_err err;
    ck_assert_msg(mr_tok_load_file(fixture_path("models/qwen3/model-BF16.gguf"), &tok, &err) == 0, "%s", err.msg);
    ck_assert_msg(mr_constrain_vocab_new(tok, &vocab, &err) == 0, "%s", err.msg);
}

static void close_all(void)
{
    mr_constrain_vocab_free(vocab);
    mr_tok_free(tok);
    vocab = NULL;
    tok = NULL;
    close_model();
}

static mr_sched *new_sched(sink_t *k, int max_seqs, int chunk)
{
    memset(k, 0, sizeof *k);
    mr_sched_opts so = {.max_seqs = max_seqs, .chunk_tokens = chunk, .vocab = vocab};
    mr_sched *s;
    mr_err err;
    ck_assert_msg(mr_sched_new(model, &so, on_event, k, &s, &err) == 0, "%s", err.msg);
    return s;
}

/* The text of an output, as the gateway would send it. */
static char *text_of(const out_t *o, size_t *len)
{
    mr_bytes b = {0};
    mr_err err;
    ck_assert_msg(mr_tok_decode(tok, o->toks, (size_t)o->n, 0, &b, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(mr_bytes_append(&b, "", 0), 0); /* NUL-terminated, even when empty */
    *len = b.len;
    return b.data;
}

/* An object with one key and a bounded number: every walk ends. */
static const char *const OBJ_GRAMMAR = "root ::= \"{\" ws \"\\\"n\\\"\" ws \":\" ws num ws \"}\"\n"
                                       "num  ::= \"-\"? [1-9] [0-9]{0,3}\n"
                                       "ws   ::= \" \"?\n";
static const char *const CHOICE_GRAMMAR = "root ::= \"yes\" | \"no\" | \"maybe not\"";
static const char *const DIGITS_GRAMMAR = "root ::= [0-9]{3}";
/* Unbounded: a list of words that only a stop id or max_tokens ends. */
static const char *const WORDS_GRAMMAR = "root ::= word (\" \" word)*\nword ::= [a-z]+";

/* Whether a fresh match of grammar accepts text as a whole sentence
 * (whole) or as the start of one. */
static bool grammar_takes(const char *grammar, const char *text, size_t len, bool whole)
{
    mr_grammar *g;
    mr_gmatch *m;
    mr_err err;
    ck_assert_msg(mr_grammar_parse(grammar, strlen(grammar), &g, &err) == 0, "%s", err.msg);
    ck_assert_msg(mr_gmatch_new(g, &m, &err) == 0, "%s", err.msg);
    bool ok = mr_gmatch_accept(m, text, len) && (!whole || mr_gmatch_can_end(m));
    mr_gmatch_free(m);
    mr_grammar_free(g);
    return ok;
}

/* The independent loop: forward the prompt, then each step the largest
 * logit among the ids whose bytes a copy of the match accepts (stop ids
 * when the output is a whole sentence), until nothing can follow. */
static int brute_greedy(const char *grammar, const int32_t *prompt, int n_prompt, const int32_t *stop, int n_stop,
                        int max_tokens, int32_t *out)
{
    mr_grammar *g;
    mr_gmatch *m;
    mr_err err;
    ck_assert_msg(mr_grammar_parse(grammar, strlen(grammar), &g, &err) == 0, "%s", err.msg);
    ck_assert_msg(mr_gmatch_new(g, &m, &err) == 0, "%s", err.msg);
    mr_seq *s;
    ck_assert_msg(mr_seq_new(model, &s, &err) == 0, "%s", err.msg);
    float *lg = malloc(sizeof(float) * (size_t)V);
    ck_assert_msg(mr_model_forward(model, s, prompt, n_prompt, MR_LOGITS_LAST, lg, &err) == 0, "%s", err.msg);
    int n = 0;
    while (n < max_tokens && mr_gmatch_can_continue(m)) {
        int32_t best = -1;
        for (int32_t id = 0; id < V; id++) {
            if (best >= 0 && !(lg[id] > lg[best]))
                continue;
            bool is_stop = false;
            for (int i = 0; i < n_stop; i++)
                is_stop |= stop[i] == id;
            bool ok;
            if (is_stop) {
                ok = mr_gmatch_can_end(m);
            } else {
                size_t len;
                const char *p = mr_constrain_piece(vocab, id, &len);
                mr_gmatch *c;
                ck_assert_msg(mr_gmatch_new(g, &c, &err) == 0, "%s", err.msg);
                /* a copy: replay what was accepted, then the piece */
                for (int i = 0; i < n; i++) {
                    size_t l2;
                    const char *p2 = mr_constrain_piece(vocab, out[i], &l2);
                    ck_assert(mr_gmatch_accept(c, p2, l2));
                }
                ok = len > 0 && mr_gmatch_accept(c, p, len);
                mr_gmatch_free(c);
            }
            if (ok)
                best = id;
        }
        ck_assert_int_ge(best, 0);
        out[n++] = best;
        bool is_stop = false;
        for (int i = 0; i < n_stop; i++)
            is_stop |= stop[i] == best;
        if (is_stop)
            break;
        size_t len;
        const char *p = mr_constrain_piece(vocab, best, &len);
        ck_assert(mr_gmatch_accept(m, p, len));
        if (n < max_tokens)
            ck_assert_msg(mr_model_forward(model, s, &best, 1, MR_LOGITS_LAST, lg, &err) == 0, "%s", err.msg);
    }
    free(lg);
    mr_seq_free(s);
    mr_gmatch_free(m);
    mr_grammar_free(g);
    return n;
}

START_TEST(greedy_matches_brute_force)
{
    open_all();
    int32_t prompt[12];
    lcg_prompt(prompt, 12, 7u, V);
    int32_t stop[2] = {mr_tok_eos(tok), mr_tok_eot(tok)};
    int n_stop = stop[1] >= 0 && stop[1] != stop[0] ? 2 : 1;
    const char *grammars[] = {OBJ_GRAMMAR, CHOICE_GRAMMAR, DIGITS_GRAMMAR};
    for (size_t gi = 0; gi < 3; gi++) {
        int32_t want[MAXT];
        int n_want = brute_greedy(grammars[gi], prompt, 12, stop, n_stop, 24, want);
        sink_t k;
        mr_sched *s = new_sched(&k, 2, 5);
        mr_request r = {.id = 1, .prompt = prompt, .n_prompt = 12, .max_tokens = 24, .stop_ids = stop,
                        .n_stop = n_stop, .grammar = grammars[gi]};
        mr_err err;
        ck_assert_msg(mr_sched_submit(s, &r, &err) == MR_SCHED_OK, "%s", err.msg);
        run_all(s);
        out_t *o = find(&k, 1);
        ck_assert(o->finished);
        ck_assert_int_eq(o->events_after_finish, 0);
        ck_assert_int_eq(o->reason, MR_SCHED_FIN_STOP);
        /* a stop id ends the output without being one of its tokens */
        int n_text = n_want;
        if (o->stop_token >= 0) {
            ck_assert_int_eq(o->stop_token, want[n_want - 1]);
            n_text--;
        }
        ck_assert_int_eq(o->n, n_text);
        for (int i = 0; i < n_text; i++)
            ck_assert_int_eq(o->toks[i], want[i]);
        size_t len;
        char *text = text_of(o, &len);
        ck_assert_msg(grammar_takes(grammars[gi], text, len, true), "grammar %zu: not a sentence: %s", gi, text);
        free(text);
        mr_sched_free(s);
    }
    close_all();
}
END_TEST

/* Sampled and greedy grammar requests batched with free ones: every
 * output is a sentence (checked by references), and the same seed alone
 * gives the same tokens. */
START_TEST(outputs_are_sentences_alone_or_batched)
{
    open_all();
    int32_t prompt[4][10];
    for (int i = 0; i < 4; i++)
        lcg_prompt(prompt[i], 10, 40u + (uint32_t)i, V);
    int32_t stop[2] = {mr_tok_eos(tok), mr_tok_eot(tok)};
    const char *grammars[4] = {OBJ_GRAMMAR, CHOICE_GRAMMAR, DIGITS_GRAMMAR, WORDS_GRAMMAR};
    out_t alone[4];
    for (int run = 0; run < 2; run++) {
        sink_t k;
        mr_sched *s = new_sched(&k, 8, run ? 3 : 64);
        mr_err err;
        for (int i = 0; i < 4; i++) {
            mr_request r = {.id = (uint64_t)(1 + i), .prompt = prompt[i], .n_prompt = 10, .max_tokens = 40,
                            .stop_ids = stop, .n_stop = 2, .grammar = grammars[i],
                            .sampling = {.temperature = 1.0f, .seed = 99u + (uint64_t)i}};
            if (run == 0) {
                /* alone */
                ck_assert_msg(mr_sched_submit(s, &r, &err) == MR_SCHED_OK, "%s", err.msg);
                run_all(s);
                alone[i] = *find(&k, r.id);
                continue;
            }
            ck_assert_msg(mr_sched_submit(s, &r, &err) == MR_SCHED_OK, "%s", err.msg);
            /* free batchmates between them */
            mr_request f = {.id = (uint64_t)(20 + i), .prompt = prompt[3 - i], .n_prompt = 10, .max_tokens = 12,
                            .sampling = {.temperature = 0.7f, .seed = 5}};
            ck_assert_msg(mr_sched_submit(s, &f, &err) == MR_SCHED_OK, "%s", err.msg);
            mr_sched_step(s, &err); /* the next joins mid-generation */
        }
        if (run)
            run_all(s);
        for (int i = 0; i < 4; i++) {
            out_t *o = find(&k, (uint64_t)(1 + i));
            ck_assert(o->finished);
            ck_assert_int_eq(o->events_after_finish, 0);
            if (run) {
                ck_assert_int_eq(o->n, alone[i].n);
                ck_assert_int_eq(o->reason, alone[i].reason);
                for (int t = 0; t < o->n; t++)
                    ck_assert_int_eq(o->toks[t], alone[i].toks[t]);
            }
            size_t len;
            char *text = text_of(o, &len);
            bool whole = o->reason == MR_SCHED_FIN_STOP;
            if (i < 3) /* the bounded grammars always end */
                ck_assert_int_eq(o->reason, MR_SCHED_FIN_STOP);
            ck_assert_msg(grammar_takes(grammars[i], text, len, whole), "grammar %d: %s", i, text);
            if (i == 0) {
                json_error_t je;
                json_t *v = json_loadb(text, len, 0, &je);
                ck_assert_msg(v != NULL, "jansson: %s: %s", text, je.text);
                ck_assert(json_is_integer(json_object_get(v, "n")));
                ck_assert_int_eq(json_object_size(v), 1);
                json_decref(v);
            } else if (i == 1) {
                ck_assert_msg(!strcmp(text, "yes") || !strcmp(text, "no") || !strcmp(text, "maybe not"), "%s", text);
                ck_assert_int_eq(o->stop_token, -1); /* nothing can extend it: no stop id drawn */
            } else if (i == 2) {
                ck_assert_int_eq(len, 3);
                for (int c = 0; c < 3; c++)
                    ck_assert(text[c] >= '0' && text[c] <= '9');
            } else {
                for (size_t c = 0; c < len; c++)
                    ck_assert_msg((text[c] >= 'a' && text[c] <= 'z') || text[c] == ' ', "%s", text);
            }
            free(text);
        }
        mr_sched_free(s);
    }
    close_all();
}
END_TEST

START_TEST(refusals)
{
    open_all();
    int32_t prompt[6];
    lcg_prompt(prompt, 6, 3u, V);
    mr_err err;
    sink_t k;
    mr_sched *s = new_sched(&k, 2, 8);
    static const char *const bad[] = {"root ::= \"unterminated", "root ::= missing", "start ::= \"x\"",
                                      "root ::= root \"x\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mr_request r = {.id = 1 + i, .prompt = prompt, .n_prompt = 6, .max_tokens = 4, .grammar = bad[i]};
        ck_assert_int_eq(mr_sched_submit(s, &r, &err), MR_SCHED_INVALID);
        ck_assert_msg(strstr(err.msg, "grammar") != NULL, "%s", err.msg);
    }
    /* nothing was admitted or reserved */
    mr_sched_stats st;
    mr_sched_get_stats(s, &st);
    ck_assert_int_eq(st.live, 0);
    ck_assert_int_eq(mr_sched_step(s, &err), 0);
    mr_sched_free(s);

    /* a scheduler without a vocabulary refuses grammars, takes the rest */
    memset(&k, 0, sizeof k);
    mr_sched_opts so = {.max_seqs = 2};
    ck_assert_msg(mr_sched_new(model, &so, on_event, &k, &s, &err) == 0, "%s", err.msg);
    mr_request r = {.id = 7, .prompt = prompt, .n_prompt = 6, .max_tokens = 2, .grammar = DIGITS_GRAMMAR};
    ck_assert_int_eq(mr_sched_submit(s, &r, &err), MR_SCHED_INVALID);
    ck_assert_msg(strstr(err.msg, "grammar") != NULL, "%s", err.msg);
    r.grammar = "";
    ck_assert_int_eq(mr_sched_submit(s, &r, &err), MR_SCHED_OK);
    run_all(s);
    ck_assert_int_eq(find(&k, 7)->n, 2);
    ck_assert_int_eq(find(&k, 7)->events_after_finish, 0);
    mr_sched_free(s);
    close_all();
}
END_TEST

/* The mask of the scheduler's vocabulary: ids past the tokenizer's (the
 * model's padded rows) are never allowed, control tokens have no bytes. */
START_TEST(mask_covers_the_model_vocabulary)
{
    open_all();
    mr_grammar *g;
    mr_gmatch *m;
    mr_err err;
    const char *any = "root ::= [^\\x00]*";
    ck_assert_msg(mr_grammar_parse(any, strlen(any), &g, &err) == 0, "%s", err.msg);
    ck_assert_msg(mr_gmatch_new(g, &m, &err) == 0, "%s", err.msg);
    int nv = (int)mr_tok_n_vocab(tok);
    ck_assert_int_le(nv, V);
    int words = (V + 31) / 32;
    uint32_t *mask = malloc(sizeof *mask * (size_t)words);
    memset(mask, 0xff, sizeof *mask * (size_t)words);
    ck_assert_msg(mr_constrain_mask(vocab, m, mask, V, &err) == 0, "%s", err.msg);
    int allowed = 0;
    for (int id = 0; id < V; id++) {
        bool bit = mask[id >> 5] >> (id & 31) & 1;
        size_t len;
        mr_constrain_piece(vocab, id, &len);
        enum mr_tok_type ty = mr_tok_type(tok, id);
        if (id >= nv || ty == MR_TOKTYPE_CONTROL)
            ck_assert_msg(!bit && len == 0, "id %d", id);
        allowed += bit;
    }
    ck_assert_int_gt(allowed, nv / 2);
    /* the bits past V in the last word are not ids: whatever they are, an
     * id beyond the tokenizer is 0 */
    free(mask);
    mr_gmatch_free(m);
    mr_grammar_free(g);
    close_all();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("constrain");
    TCase *tc = tcase_create("constrain");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, greedy_matches_brute_force);
    tcase_add_test(tc, outputs_are_sentences_alone_or_batched);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, mask_covers_the_model_vocabulary);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
