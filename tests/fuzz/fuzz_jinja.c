/* libFuzzer target: any bytes as a template, rendered with a small chat
 * context under tight limits.  Must never crash, leak or hang. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/jinja.h"

static json_t *ctx;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ctx) {
        ctx = json_loads(
            "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", "
            "\"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"<think>r</think>a\", "
            "\"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"x\": [1, 2.5]}}}]}, "
            "{\"role\": \"tool\", \"content\": [{\"type\": \"text\", \"text\": \"t\"}]}], "
            "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
            "\"add_generation_prompt\": true, \"enable_thinking\": false, \"bos_token\": \"<s>\"}",
            0, NULL);
        if (!ctx)
            abort();
    }
    if (size > 64 * 1024)
        return 0;
    mr_err err;
    mr_jinja_tmpl *t = mr_jinja_parse((const char *)data, size, &err);
    if (!t)
        return 0;
    mr_jinja_opts o;
    mr_jinja_opts_default(&o);
    o.max_output = 1 << 20;
    o.max_memory = 16 << 20;
    o.max_steps = 200000;
    o.max_depth = 128;
    o.now = 0;
    char *out;
    size_t len;
    if (mr_jinja_render(t, ctx, &o, &out, &len, &err) == 0)
        free(out);
    mr_jinja_free(t);
    return 0;
}
