/* Self-speculative greedy decoding with the MTP block (see spec.h).
 *
 * Invariant at the top of each step: the sequence holds L tokens, the next
 * token t (position L) is known but not yet run, the MTP block has run
 * positions 0..L-1 (row p pairs the trunk's hidden row p with token p+1)
 * and its last row's logits give the first draft d1.
 * Step: chain the MTP block for d2..dk (positions L..L+k-2), run the trunk
 * on [t, d1..dk], accept d1..dj while they equal the trunk's argmax, take
 * the trunk's token b after them; on a partial acceptance restore the
 * recurrent snapshot, truncate to L and re-run [t, d1..dj]; then run the MTP
 * block on rows L..L+j with tokens [d1..dj, b] for the next d1. */
#include <stdlib.h>
#include <string.h>

#include "worker/model_internal.h"
#include "worker/sample.h"
#include "worker/spec.h"

bool mr_spec_supported(const mr_model *m) { return mr_qwen35_has_mtp(m); }

int mr_spec_generate(mr_model *m, const int32_t *prompt, int n_prompt, int n_gen, int k,
                     const mr_spec_drafter *override, int32_t *out, mr_spec_stats *stats,
                     mr_err *err)
{
    mr_spec_stats st = {0};
    if (!mr_spec_supported(m))
        return mr_errf(err, "speculation: model '%s' has no MTP block", m->hp.arch_name);
    if (k < 1 || k > 8)
        return mr_errf(err, "speculation: k = %d, need 1..8", k);
    if (n_prompt < 1 || n_gen < 1)
        return mr_errf(err, "speculation: %d prompt tokens, %d to generate (need at least 1 each)",
                       n_prompt, n_gen);
    int V = m->hp.n_vocab;
    int rows = n_prompt > k + 1 ? n_prompt : k + 1;
    float *logits = malloc(sizeof(float) * (size_t)rows * (size_t)V);
    float *mlog = malloc(sizeof(float) * (size_t)rows * (size_t)V);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)rows);
    int32_t draft[9];
    void *snap = malloc(m->rstate_bytes ? m->rstate_bytes : 1);
    mr_seq *s = NULL;
    int rc = -1;
    if (!logits || !mlog || !toks || !snap) {
        mr_errf(err, "out of memory");
        goto done;
    }
    if (mr_seq_new(m, &s, err) ||
        mr_model_forward(m, s, prompt, n_prompt, MR_LOGITS_ALL, logits, err))
        goto done;
    int32_t t = mr_sample_argmax(logits + (size_t)(n_prompt - 1) * V, V);
    int n_out = 0;
    out[n_out++] = t;
    if (n_out == n_gen) {
        rc = 0;
        goto done;
    }
    /* MTP over the prompt: row p pairs hidden p with token p + 1 */
    memcpy(toks, prompt + 1, sizeof(int32_t) * (size_t)(n_prompt - 1));
    toks[n_prompt - 1] = t;
    if (mr_qwen35_mtp(m, s, m->sc.xn, toks, n_prompt, 0, mlog, err))
        goto done;
    int32_t d1 = mr_sample_argmax(mlog + (size_t)(n_prompt - 1) * V, V);
    int mtp_rows = n_prompt; /* rows of the last MTP call: its last one feeds the chain */
    size_t E = (size_t)m->hp.n_embd;

    while (n_out < n_gen) {
        int L = mr_seq_len(s);
        int kk = k;
        if (kk > n_gen - n_out)
            kk = n_gen - n_out;      /* no drafts beyond what is asked for */
        if (kk > m->n_ctx - L - 1)
            kk = m->n_ctx - L - 1;   /* verify writes positions L..L+kk */
        if (kk < 1) {
            mr_errf(err, "speculation: context of %d tokens is full", m->n_ctx);
            goto done;
        }
        draft[0] = d1;
        for (int i = 1; i < kk; i++) {
            const float *h = mr_qwen35_mtp_hidden(m) + (size_t)(mtp_rows - 1) * E;
            if (mr_qwen35_mtp(m, s, h, &draft[i - 1], 1, L + i - 1, mlog, err))
                goto done;
            mtp_rows = 1;
            draft[i] = mr_sample_argmax(mlog, V);
        }
        if (override)
            override->replace(override->ctx, n_out, kk, draft);
        for (int i = 0; i < kk; i++) {
            if (draft[i] < 0 || draft[i] >= V) {
                mr_errf(err, "speculation: draft token %d is out of range [0, %d)", draft[i], V);
                goto done;
            }
        }
        if (mr_seq_state_save(s, snap, err))
            goto done;
        toks[0] = t;
        memcpy(toks + 1, draft, sizeof(int32_t) * (size_t)kk);
        if (mr_model_forward_gen(m, s, toks, kk + 1, MR_LOGITS_ALL, logits, err))
            goto done;
        st.verifies++;
        st.drafted += kk;
        int j = 0;
        while (j < kk && mr_sample_argmax(logits + (size_t)j * V, V) == draft[j])
            j++;
        st.accepted += j;
        int32_t b = mr_sample_argmax(logits + (size_t)j * V, V);
        for (int i = 0; i < j && n_out < n_gen; i++)
            out[n_out++] = draft[i];
        if (n_out < n_gen)
            out[n_out++] = b;
        if (n_out == n_gen)
            break;
        if (j < kk) {
            /* the rejected drafts went through the recurrent layers: rebuild */
            if (mr_seq_truncate(s, L, err) || mr_seq_state_load(s, snap, err) ||
                mr_model_forward_gen(m, s, toks, j + 1, MR_LOGITS_ALL, logits, err))
                goto done;
            st.replays++;
        }
        /* MTP rows L..L+j: hidden of [t, d1..dj] with tokens [d1..dj, b] */
        memcpy(toks, draft, sizeof(int32_t) * (size_t)j);
        toks[j] = b;
        if (mr_qwen35_mtp(m, s, m->sc.xn, toks, j + 1, L, mlog, err))
            goto done;
        d1 = mr_sample_argmax(mlog + (size_t)j * V, V);
        mtp_rows = j + 1;
        t = b;
    }
    rc = 0;
done:
    if (stats)
        *stats = st;
    mr_seq_free(s);
    free(logits);
    free(mlog);
    free(toks);
    free(snap);
    return rc;
}
