/* The chat reply splitter (gateway/chatout.h): which format the real chat
 * templates of ../shared/fixtures select, what a reply splits into, and that
 * a reply fed in any pieces splits exactly as when it comes whole (a stream
 * shows what the blocking response holds).  The round trips through the
 * templates' own renderings are tests/node/serve_tools.mjs. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "gateway/chatout.h"
#include "tests/unit/testutil.h"

static char *read_template(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "templates/%s", name);
    size_t len;
    mr_err err;
    char *s = mr_file_read(fixture_path(rel), &len, &err);
    ck_assert_msg(s != NULL, "%s", err.msg);
    return s;
}

START_TEST(formats_of_the_real_templates)
{
    static const struct {
        const char *file;
        bool think;
        mr_tool_format tools;
    } cases[] = {
        {"Qwen-Qwen3-0.6B.jinja", true, MR_TOOLS_HERMES},     {"Qwen3.5-4B.jinja", true, MR_TOOLS_QWEN_XML},
        {"Qwen3-Coder.jinja", false, MR_TOOLS_QWEN_XML},      {"StepFun3.5-Flash.jinja", true, MR_TOOLS_QWEN_XML},
        {"google-gemma-2-2b-it.jinja", false, MR_TOOLS_NONE}, {"google-gemma-3.jinja", false, MR_TOOLS_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *t = read_template(cases[i].file);
        mr_chat_format f;
        mr_err err;
        ck_assert_int_eq(mr_chat_format_resolve(t, "auto", "auto", &f, &err), 0);
        ck_assert_msg(f.think == cases[i].think && f.tools == cases[i].tools, "%s: think %d tools %d", cases[i].file,
                      f.think, f.tools);
        /* the config wins over the template */
        ck_assert_int_eq(mr_chat_format_resolve(t, "none", "none", &f, &err), 0);
        ck_assert(!f.think && f.tools == MR_TOOLS_NONE);
        free(t);
    }
    mr_chat_format f;
    mr_err err;
    ck_assert_int_eq(mr_chat_format_resolve(NULL, "auto", "auto", &f, &err), 0);
    ck_assert(!f.think && f.tools == MR_TOOLS_NONE); /* ChatML */
    ck_assert_int_eq(mr_chat_format_resolve(NULL, "deepseek", "auto", &f, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "reasoning_parser"));
    ck_assert_int_eq(mr_chat_format_resolve(NULL, "auto", "mistral", &f, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "tool_parser"));
}
END_TEST

START_TEST(prompt_opens_think)
{
    mr_chat_format f = {.think = true};
    const char *open = "<|im_start|>assistant\n<think>\n";
    const char *closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    ck_assert(mr_chat_prompt_opens_think(&f, open, strlen(open)));
    ck_assert(!mr_chat_prompt_opens_think(&f, closed, strlen(closed)));
    f.think = false;
    ck_assert(!mr_chat_prompt_opens_think(&f, open, strlen(open)));
}
END_TEST

/* What a reply splits into: "R:..." for reasoning, "C:..." for content and
 * "T:name args" for a call, one line each, consecutive pieces of one kind
 * joined. */
typedef struct split {
    mr_buf out;
    int last; /* kind of the last line, -1 none */
} split;

static void collect(split *sp, mr_co_events *ev)
{
    for (size_t i = 0; i < ev->n; i++) {
        mr_co_event *e = &ev->v[i];
        if (e->kind == MR_CO_TOOL) {
            mr_buf_printf(&sp->out, "%sT:%s %s", sp->out.len ? "\n" : "",
                          json_string_value(json_object_get(e->call, "name")),
                          json_string_value(json_object_get(e->call, "arguments")));
            sp->last = -1;
            continue;
        }
        if ((int)e->kind != sp->last)
            mr_buf_printf(&sp->out, "%s%c:", sp->out.len ? "\n" : "", e->kind == MR_CO_CONTENT ? 'C' : 'R');
        mr_buf_add(&sp->out, e->text.p, e->text.len);
        sp->last = (int)e->kind;
    }
    mr_co_events_clear(ev);
}

/* Splits text fed in pieces of at most `step` bytes (0: whole). */
static char *run_split(const mr_chat_format *f, bool in_think, json_t *tools, const char *text, size_t step)
{
    mr_chatout c;
    mr_co_events ev = {0};
    split sp = {.last = -1};
    mr_chatout_init(&c, f, in_think, tools, true, true);
    size_t n = strlen(text);
    for (size_t i = 0; i < n;) {
        size_t k = step && n - i > step ? step : n - i;
        mr_chatout_push(&c, text + i, k, &ev);
        collect(&sp, &ev);
        i += k;
    }
    mr_chatout_finish(&c, &ev);
    collect(&sp, &ev);
    mr_chatout_free(&c);
    mr_co_events_free(&ev);
    char *s = strdup(sp.out.p ? sp.out.p : "");
    mr_buf_free(&sp.out);
    return s;
}

static void expect_split(const mr_chat_format *f, bool in_think, json_t *tools, const char *text, const char *want)
{
    for (size_t step = 0; step <= 13; step++) {
        char *got = run_split(f, in_think, tools, text, step);
        ck_assert_msg(!strcmp(got, want), "pieces of %zu: %s\n--- got:\n%s\n--- want:\n%s", step, text, got, want);
        free(got);
    }
}

START_TEST(splits)
{
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
                               "\"object\",\"properties\":{\"n\":{\"type\":\"integer\"},\"x\":{\"type\":\"number\"},"
                               "\"b\":{\"type\":[\"boolean\",\"null\"]},\"o\":{\"type\":\"object\"},\"s\":{\"type\":"
                               "\"string\"}}}}}]",
                               0, NULL);
    ck_assert_ptr_nonnull(tools);
    mr_chat_format qwen3 = {.think = true, .tools = MR_TOOLS_HERMES};
    mr_chat_format qwen35 = {.think = true, .tools = MR_TOOLS_QWEN_XML};
    mr_chat_format plain = {0};

    expect_split(&qwen3, false, NULL, "<think>\nI think.\n</think>\n\nThe answer.", "R:I think.\nC:The answer.");
    expect_split(&qwen3, false, NULL, "  <think>a</think>b", "R:a\nC:b");
    expect_split(&qwen3, false, NULL, "Just text <think>", "C:Just text <think>");
    expect_split(&qwen3, false, NULL, "<thin", "C:<thin");
    expect_split(&qwen3, false, NULL, "<think>\nnever closed\n\n", "R:never closed");
    expect_split(&qwen3, false, NULL, "<think>\n\n</think>\n\n", "");
    expect_split(&plain, false, NULL, "<think>x</think>y", "C:<think>x</think>y");
    /* opened by the prompt */
    expect_split(&qwen35, true, NULL, "\nstep 1\nstep 2\n</think>\n\nDone.\n", "R:step 1\nstep 2\nC:Done.\n");
    /* calls: only parsed when the request has tools */
    const char *call = "Sure.\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 1, \"x\": 48.85}}\n</tool_call>";
    expect_split(&qwen3, false, tools, call, "C:Sure.\nT:f {\"n\":1,\"x\":48.85}");
    expect_split(&qwen3, false, NULL, call, "C:Sure.\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 1, \"x\": 48.85}}\n</tool_call>");
    expect_split(&qwen3, false, tools,
                 "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"n\\\": 2}\"}\n</tool_call>\n<tool_call>\n{\"name\": "
                 "\"g\"}\n</tool_call>\n",
                 "T:f {\"n\": 2}\nT:g {}");
    /* arguments in a string must still be a JSON object (clients parse them) */
    expect_split(&qwen3, false, tools, "<tool_call>{\"name\": \"f\", \"arguments\": \",n\"}</tool_call>",
                 "C:<tool_call>{\"name\": \"f\", \"arguments\": \",n\"}</tool_call>");
    expect_split(&qwen3, false, tools, "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
                 "C:<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>");
    expect_split(&qwen3, false, tools, "<tool_call>{\"arguments\": {}}</tool_call> after",
                 "C:<tool_call>{\"arguments\": {}}</tool_call> after");
    expect_split(&qwen3, false, tools, "x <tool_call>{\"name\": \"f\"", "C:x <tool_call>{\"name\": \"f\"");
    expect_split(&qwen3, false, tools, "a < b and <tool_ca", "C:a < b and <tool_ca");
    expect_split(&qwen35, true, tools,
                 "r\n</think>\n\n<tool_call>\n<function=f>\n<parameter=n>\n-12\n</parameter>\n<parameter=x>\n1e3\n"
                 "</parameter>\n<parameter=b>\nTrue\n</parameter>\n<parameter=o>\n{\"k\": [1]}\n</parameter>\n"
                 "<parameter=s>\n\nline 1\nline 2\n\n</parameter>\n<parameter=z>\nnull\n</parameter>\n</function>\n"
                 "</tool_call>",
                 "R:r\nT:f {\"n\":-12,\"x\":1000.0,\"b\":true,\"o\":{\"k\":[1]},\"s\":\"\\nline 1\\nline 2\\n\",\"z\":null}");
    /* values that are not their declared type stay text; unknown parameters are text */
    expect_split(&qwen35, false, tools,
                 "<tool_call>\n<function=f>\n<parameter=n>\n1.5\n</parameter>\n<parameter=b>\nyes\n</parameter>\n"
                 "<parameter=o>\n[1]\n</parameter>\n<parameter=q>\n7\n</parameter>\n</function>\n</tool_call>",
                 "T:f {\"n\":\"1.5\",\"b\":\"yes\",\"o\":\"[1]\",\"q\":\"7\"}");
    /* forgiven: a missing </parameter> or </function>; not forgiven: text after </function> */
    expect_split(&qwen35, false, tools, "<tool_call><function=f><parameter=s>v<parameter=n>3</tool_call>",
                 "T:f {\"s\":\"v\",\"n\":3}");
    expect_split(&qwen35, false, tools, "<tool_call><function=f></function>junk</tool_call>",
                 "C:<tool_call><function=f></function>junk</tool_call>");
    expect_split(&qwen35, false, tools, "<tool_call><function=>\n</function></tool_call>",
                 "C:<tool_call><function=>\n</function></tool_call>");
    json_decref(tools);
}
END_TEST

START_TEST(parallel_and_reasoning_switches)
{
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", 0, NULL);
    mr_chat_format f = {.think = true, .tools = MR_TOOLS_HERMES};
    const char *text = "<think>r</think><tool_call>{\"name\":\"f\"}</tool_call><tool_call>{\"name\":\"g\"}</tool_call>";
    mr_chatout c;
    mr_co_events ev = {0};
    mr_chatout_init(&c, &f, false, tools, false, false);
    mr_chatout_push(&c, text, strlen(text), &ev);
    mr_chatout_finish(&c, &ev);
    ck_assert_uint_eq(ev.n, 1); /* no reasoning, one call */
    ck_assert_int_eq(ev.v[0].kind, MR_CO_TOOL);
    ck_assert_str_eq(json_string_value(json_object_get(ev.v[0].call, "name")), "f");
    ck_assert_uint_eq(c.n_calls, 2);
    mr_chatout_free(&c);
    mr_co_events_free(&ev);
    json_decref(tools);
}
END_TEST

/* An unclosed call a megabyte long is searched once, not once a piece. */
START_TEST(long_open_call_is_linear)
{
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", 0, NULL);
    mr_chat_format f = {.tools = MR_TOOLS_HERMES};
    mr_chatout c;
    mr_co_events ev = {0};
    mr_chatout_init(&c, &f, false, tools, true, true);
    mr_chatout_push(&c, "<tool_call>", 11, &ev);
    char piece[4] = "abc";
    for (int i = 0; i < 1 << 18; i++)
        mr_chatout_push(&c, piece, 3, &ev);
    ck_assert_uint_eq(ev.n, 0);
    mr_chatout_push(&c, "</tool_call>", 12, &ev);
    ck_assert_uint_eq(ev.n, 1); /* not a call: its text as content */
    ck_assert_uint_eq(ev.v[0].text.len, 11 + 3 * (1 << 18) + 12);
    mr_chatout_free(&c);
    mr_co_events_free(&ev);
    json_decref(tools);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("chatout");
    TCase *tc = tcase_create("chatout");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, formats_of_the_real_templates);
    tcase_add_test(tc, prompt_opens_think);
    tcase_add_test(tc, splits);
    tcase_add_test(tc, parallel_and_reasoning_switches);
    tcase_add_test(tc, long_open_call_is_linear);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
