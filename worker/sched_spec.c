/* MTP self-speculation steps, for the scheduler and for the standalone
 * loop of worker/spec.c (see sched_spec.h).
 *
 * Row bookkeeping: MTP row p pairs the trunk's output-normed
 * hidden row of position p with the token at p + 1.  After the verify call
 * (or its replay) sc.xn holds the hidden rows of [t, d1..dj] (positions
 * L..L+j), which the MTP block pairs with [d1..dj, b]; its last row's
 * logits give the next step's first draft. */
#include <stdlib.h>
#include <string.h>

#include "worker/model_internal.h"
#include "worker/sched_spec.h"

enum { SPEC_K_MAX = 8 };

struct mr_sched_spec {
    mr_model *m;
    int k;
    mr_spec_drafter drafter;
    uint64_t epoch;
    /* the trunk's pick at each verify (or replay) row: chosen by the
     * backend, so a step downloads k + 1 ids, not k + 1 rows of logits */
    int32_t ids[SPEC_K_MAX + 1];
    int32_t toks[SPEC_K_MAX + 1];
    int32_t draft[SPEC_K_MAX];
    int32_t cand[SPEC_K_MAX + 1];
    int32_t *prime_toks; /* [prime_cap] the tokens of a chunk's MTP rows */
    int prime_cap;
    /* the recurrent state before the verify call: in backend memory (no
     * host round trip each step), or on the host when the backend had no
     * room for it */
    void *snap_dev;
    void *snap;
    /* the verify call kept its recurrent layers' inputs: a rejection
     * replays only those layers' convolution and scan over the kept rows
     * (mr_qwen35_rec_replay) instead of the whole trunk */
    bool rec_kept;
    /* the verify call awaiting its commit */
    bool pending;
    mr_seq *seq;
    int L, kk, j;
    mr_sched_spec_stats st;
};

int mr_sched_spec_new(mr_model *m, int k, const mr_spec_drafter *drafter, mr_sched_spec **out, mr_err *err)
{
    *out = NULL;
    if (!mr_spec_supported(m))
        return mr_errf(err, "speculation: model '%s' has no MTP block", m->hp.arch_name);
    if (k < 1 || k > SPEC_K_MAX)
        return mr_errf(err, "speculation: k = %d, need 1..%d", k, SPEC_K_MAX);
    mr_sched_spec *p = calloc(1, sizeof *p);
    if (!p)
        return mr_errf(err, "speculation: out of memory");
    p->m = m;
    p->k = k;
    if (drafter)
        p->drafter = *drafter;
    p->snap_dev = mr_model_state_alloc(m);
    if (!p->snap_dev)
        p->snap = malloc(m->rstate_bytes ? m->rstate_bytes : 1);
    if (!p->snap_dev && !p->snap) {
        mr_sched_spec_free(p);
        return mr_errf(err, "speculation: out of memory for %d drafts", k);
    }
    *out = p;
    return 0;
}

void mr_sched_spec_free(mr_sched_spec *p)
{
    if (!p)
        return;
    free(p->snap);
    free(p->prime_toks);
    mr_model_state_free(p->m, p->snap_dev);
    free(p);
}

void mr_sched_spec_invalidate(mr_sched_spec *p)
{
    p->epoch++;
    p->pending = false;
}

/* The MTP block over n rows from position pos0: hidden rows in sc.xn (the
 * last trunk call's) paired with toks; its last row's argmax is the next
 * step's first draft. */
static int mtp_rows(mr_sched_spec *p, mr_seq *seq, mr_spec_state *st, const int32_t *toks, int n, int pos0,
                    mr_err *err)
{
    mr_model *m = p->m;
    int32_t d1;
    if (mr_qwen35_mtp(m, seq, m->sc.xn, toks, n, pos0, &d1, err))
        return mr_err_wrap(err, "speculation: drafting");
    *st = (mr_spec_state){.valid = true, .len = pos0 + n, .epoch = p->epoch, .d1 = d1, .mtp_rows = n};
    return 0;
}

/* p->toks[0..n) through the trunk as generated rows (the decode numerics,
 * so the pick of every row is the id plain decoding would pick there),
 * every row's pick into p->ids and its hidden row left in sc.xn for the
 * MTP block. */
static int trunk_rows(mr_sched_spec *p, mr_seq *seq, int n, mr_err *err)
{
    mr_batch_item it = {
        .seq = seq, .tokens = p->toks, .n = n, .mode = MR_LOGITS_ARGMAX_ALL, .argmax = p->ids, .gen = true};
    return mr_model_forward_batch(p->m, &it, 1, err);
}

int mr_sched_spec_verify(mr_sched_spec *p, mr_seq *seq, mr_spec_state *st, int32_t t, int first, int max_new,
                         const int32_t **cand, int *n_cand, mr_err *err)
{
    mr_model *m = p->m;
    int V = m->hp.n_vocab, L = mr_seq_len(seq);
    size_t E = (size_t)m->hp.n_embd;
    if (max_new < 1)
        return mr_errf(err, "speculation: %d tokens left to generate", max_new);
    int kk = p->k;
    if (kk > max_new - 1)
        kk = max_new - 1;   /* all accepted plus the trunk's token: exactly max_new */
    if (kk > m->n_ctx - L - 1)
        kk = m->n_ctx - L - 1; /* verify writes positions L..L+kk */
    /* the first draft chains from hidden rows only the request's own last
     * MTP call left; after any other call there is none: a plain step */
    if (!st->valid || st->epoch != p->epoch || st->len != L)
        kk = 0;
    if (kk < 0)
        kk = 0;
    st->valid = false;
    p->pending = false;
    p->epoch++; /* whatever happens now, the MTP hidden rows are this call's */

    if (kk > 0) {
        p->draft[0] = st->d1;
        int rows = st->mtp_rows;
        for (int i = 1; i < kk; i++) {
            const float *h = mr_qwen35_mtp_hidden(m) + (size_t)(rows - 1) * E;
            if (mr_qwen35_mtp(m, seq, h, &p->draft[i - 1], 1, L + i - 1, &p->draft[i], err))
                return mr_err_wrap(err, "speculation: drafting");
            rows = 1;
        }
        if (p->drafter.replace)
            p->drafter.replace(p->drafter.ctx, first, kk, p->draft);
        for (int i = 0; i < kk; i++)
            if (p->draft[i] < 0 || p->draft[i] >= V)
                return mr_errf(err, "speculation: draft token %d is out of range [0, %d)", p->draft[i], V);
        /* the verify call runs the drafts through the recurrent layers too:
         * keep the state of L tokens for a rejection */
        if (p->snap_dev)
            mr_seq_state_copy_out(seq, p->snap_dev);
        else if (mr_seq_state_save(seq, p->snap, err))
            return mr_err_wrap(err, "speculation: state snapshot");
    }
    p->toks[0] = t;
    memcpy(p->toks + 1, p->draft, sizeof(int32_t) * (size_t)kk);
    /* with drafts a rejection may follow: keep the recurrent inputs (no
     * backend memory for them: the whole trunk is replayed instead).  Room
     * for k + 1 rows from the first step on, so the buffer never moves
     * under a recorded graph. */
    p->rec_kept = kk > 0 && mr_qwen35_rec_arm(m, p->k + 1, err) == 0;
    /* generated rows: the decode numerics, so the trunk's argmax of every
     * row is the id plain decoding would pick there */
    if (trunk_rows(p, seq, kk + 1, err))
        return mr_err_wrap(err, "speculation: verify");
    p->st.steps++;
    p->st.drafted += (uint64_t)kk;
    p->st.tokens += (uint64_t)kk + 1;
    int j = 0;
    while (j < kk && p->ids[j] == p->draft[j])
        j++;
    p->st.accepted += (uint64_t)j;
    memcpy(p->cand, p->draft, sizeof(int32_t) * (size_t)j);
    p->cand[j] = p->ids[j];
    p->pending = true;
    p->seq = seq;
    p->L = L;
    p->kk = kk;
    p->j = j;
    *cand = p->cand;
    *n_cand = j + 1;
    return 0;
}

int mr_sched_spec_commit(mr_sched_spec *p, mr_seq *seq, mr_spec_state *st, int keep, bool more, mr_err *err)
{
    if (!p->pending || p->seq != seq)
        return mr_errf(err, "speculation: commit without its verify call");
    p->pending = false;
    int L = p->L, kk = p->kk, j = p->j;
    if (keep < 1 || keep > j + 1 || (more && keep != j + 1))
        return mr_errf(err, "speculation: keeping %d of %d tokens%s", keep, j + 1, more ? " and going on" : "");
    if (!more) {
        /* positions L..L+keep-1 ran accepted tokens: their K/V stay */
        if (mr_seq_truncate(seq, L + keep, err))
            return mr_err_wrap(err, "speculation");
        return 0;
    }
    if (j < kk) {
        /* rejected drafts went through the recurrent layers: back to the
         * state of L tokens and run the accepted ones again: through the
         * recurrent layers alone when the verify call kept their inputs
         * (the K/V of the kept positions and their hidden rows are the
         * verify call's already: generated rows get the same bits in a call
         * of any size), else through the whole trunk */
        if (mr_seq_truncate(seq, p->rec_kept ? L + j + 1 : L, err))
            return mr_err_wrap(err, "speculation: replay");
        if (p->snap_dev)
            mr_seq_state_copy_in(seq, p->snap_dev);
        else if (mr_seq_state_load(seq, p->snap, err))
            return mr_err_wrap(err, "speculation: replay");
        if (p->rec_kept) {
            if (mr_qwen35_rec_replay(p->m, seq, j + 1, err))
                return mr_err_wrap(err, "speculation: replay");
            mr_seq_state_settled(seq);
        } else {
            if (trunk_rows(p, seq, j + 1, err))
                return mr_err_wrap(err, "speculation: replay");
            p->st.tokens += (uint64_t)j + 1;
        }
        p->st.replays++;
    }
    /* MTP rows L..L+j: hidden of [t, d1..dj] (left in sc.xn by the last
     * trunk call) with tokens [d1..dj, b] */
    return mtp_rows(p, seq, st, p->cand, j + 1, L, err);
}

/* The tokens of the MTP rows over prompt ids[0..n) (row p pairs hidden p
 * with token p + 1: the ids after the first, then next), in p->prime_toks. */
static int32_t *prime_toks(mr_sched_spec *p, const int32_t *ids, int n, int32_t next, mr_err *err)
{
    if (n > p->prime_cap) {
        int32_t *t = realloc(p->prime_toks, sizeof(int32_t) * (size_t)n);
        if (!t) {
            mr_errf(err, "speculation: out of memory for %d prompt rows", n);
            return NULL;
        }
        p->prime_toks = t;
        p->prime_cap = n;
    }
    memcpy(p->prime_toks, ids + 1, sizeof(int32_t) * (size_t)(n - 1));
    p->prime_toks[n - 1] = next;
    return p->prime_toks;
}

int mr_sched_spec_prime(mr_sched_spec *p, mr_seq *seq, mr_spec_state *st, const int32_t *prompt, int n_prompt,
                        int32_t t, mr_err *err)
{
    if (n_prompt < 1 || mr_seq_len(seq) != n_prompt)
        return mr_errf(err, "speculation: priming %d prompt rows of a sequence of %d", n_prompt, mr_seq_len(seq));
    int32_t *toks = prime_toks(p, prompt, n_prompt, t, err);
    if (!toks)
        return -1;
    p->epoch++; /* the hidden rows are this call's */
    int rc = mtp_rows(p, seq, st, toks, n_prompt, 0, err);
    if (rc == 0)
        p->st.primed += (uint64_t)n_prompt;
    return rc;
}

int mr_sched_spec_keep_rows(mr_sched_spec *p, int row0, int n, mr_err *err)
{
    if (mr_qwen35_mtp_keep(p->m, row0, n, err))
        return mr_err_wrap(err, "speculation: keeping %d prompt rows", n);
    return 0;
}

int mr_sched_spec_prime_chunk(mr_sched_spec *p, mr_seq *seq, mr_spec_state *st, int row0, const int32_t *chunk,
                              int n, int32_t next, mr_err *err)
{
    int len = mr_seq_len(seq);
    if (n < 1 || n > len)
        return mr_errf(err, "speculation: priming %d prompt rows of a sequence of %d", n, len);
    int32_t *toks = prime_toks(p, chunk, n, next, err);
    if (!toks)
        return -1;
    p->epoch++; /* the MTP hidden rows will be this call's */
    int32_t d1;
    if (mr_qwen35_mtp_prompt(p->m, seq, row0, toks, n, len - n, &d1, err))
        return mr_err_wrap(err, "speculation: priming positions %d..%d", len - n, len - 1);
    *st = (mr_spec_state){.valid = true, .len = len, .epoch = p->epoch, .d1 = d1, .mtp_rows = n};
    p->st.primed += (uint64_t)n;
    return 0;
}

void mr_sched_spec_get_stats(const mr_sched_spec *p, mr_sched_spec_stats *out)
{
    if (p)
        *out = p->st;
    else
        memset(out, 0, sizeof *out);
}
