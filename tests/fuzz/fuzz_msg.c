/* libFuzzer target: the gateway<->worker message decoder.  Anything it
 * accepts must re-encode, and decode again to the same bytes. */
#include <stdlib.h>
#include <string.h>

#include "proto/msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mr_msg m;
    mr_err err;
    uint64_t id;
    if (mr_msg_decode(data, size, &m, &id, &err) != 0)
        return 0;
    void *a, *b;
    size_t na, nb;
    if (mr_msg_encode(&m, &a, &na, &err) != 0)
        abort(); /* decode validated it, so encode must accept it */
    mr_msg m2;
    if (mr_msg_decode(a, na, &m2, NULL, &err) != 0)
        abort();
    if (mr_msg_encode(&m2, &b, &nb, &err) != 0 || na != nb || memcmp(a, b, na) != 0)
        abort();
    free(a);
    free(b);
    mr_msg_free(&m);
    mr_msg_free(&m2);
    return 0;
}
