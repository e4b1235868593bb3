/* Self-speculative greedy decoding with the MTP block (see spec.h): the
 * prompt, the MTP block over it for the first draft, then the steps of
 * worker/sched_spec.c (draft, verify in one trunk call, keep the agreeing
 * drafts and the trunk's token, restore and replay after a rejection) until
 * n_gen tokens. */
#include <stdlib.h>
#include <string.h>

#include "worker/model_internal.h"
#include "worker/sample.h"
#include "worker/sched_spec.h"
#include "worker/spec.h"

bool mr_spec_supported(const mr_model *m) { return mr_qwen35_has_mtp(m); }

int mr_spec_generate(mr_model *m, const int32_t *prompt, int n_prompt, int n_gen, int k,
                     const mr_spec_drafter *override, int32_t *out, mr_spec_stats *stats,
                     mr_err *err)
{
    if (stats)
        *stats = (mr_spec_stats){0};
    if (n_prompt < 1 || n_gen < 1)
        return mr_errf(err, "speculation: %d prompt tokens, %d to generate (need at least 1 each)",
                       n_prompt, n_gen);
    mr_sched_spec *p;
    if (mr_sched_spec_new(m, k, override, &p, err))
        return -1;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_prompt);
    mr_seq *s = NULL;
    mr_spec_state st = {0};
    int rc = -1;
    if (!ids) {
        mr_errf(err, "out of memory");
        goto done;
    }
    /* every row through the output head (the MTP block reads every prompt
     * row's hidden state), only the picks come back */
    if (mr_seq_new(m, &s, err))
        goto done;
    mr_batch_item it = {.seq = s, .tokens = prompt, .n = n_prompt, .mode = MR_LOGITS_ARGMAX_ALL, .argmax = ids};
    if (mr_model_forward_batch(m, &it, 1, err))
        goto done;
    int32_t t = ids[n_prompt - 1];
    int n_out = 0;
    out[n_out++] = t;
    if (n_out < n_gen && mr_sched_spec_prime(p, s, &st, prompt, n_prompt, t, err))
        goto done;
    while (n_out < n_gen) {
        const int32_t *cand;
        int n_cand;
        if (mr_sched_spec_verify(p, s, &st, t, n_out, n_gen - n_out, &cand, &n_cand, err))
            goto done;
        memcpy(out + n_out, cand, sizeof(int32_t) * (size_t)n_cand); /* n_cand <= n_gen - n_out */
        n_out += n_cand;
        t = cand[n_cand - 1];
        if (mr_sched_spec_commit(p, s, &st, n_cand, n_out < n_gen, err))
            goto done;
    }
    rc = 0;
done:
    if (stats) {
        mr_sched_spec_stats ss;
        mr_sched_spec_get_stats(p, &ss);
        *stats = (mr_spec_stats){.drafted = (int)ss.drafted, .accepted = (int)ss.accepted,
                                 .verifies = (int)ss.steps, .replays = (int)ss.replays};
    }
    mr_seq_free(s);
    mr_sched_spec_free(p);
    free(ids);
    return rc;
}
