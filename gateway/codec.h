/* Text <-> token ids for one model, as the gateway needs them: encode a
 * prompt, render chat messages to a prompt, and give the bytes of each
 * generated token for incremental detokenization. */
#ifndef MR_CODEC_H
#define MR_CODEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "gateway/util.h"

typedef struct mr_codec mr_codec;
struct mr_codec {
    const char *kind;
    uint32_t n_vocab;
    /* chat: the text is a rendered chat prompt (special tokens written in it
     * are parsed); otherwise a raw prompt (BOS added as the model says). */
    int (*encode)(mr_codec *c, const char *text, size_t len, bool chat, uint32_t **ids, uint32_t *n, mr_err *err);
    /* Appends the raw bytes of token id (possibly a partial UTF-8 character). */
    int (*piece)(mr_codec *c, uint32_t id, mr_buf *out, mr_err *err);
    /* Renders a validated OpenAI chat request (the whole body: messages,
     * tools, chat_template_kwargs, enable_thinking, add_generation_prompt)
     * into the prompt text. */
    int (*chat)(mr_codec *c, const json_t *body, mr_buf *prompt, mr_err *err);
    void (*destroy)(mr_codec *c);
    /* the chat template's text (NULL: ChatML), whose markers say how the
     * model writes reasoning and tool calls (gateway/chatout.h) */
    char *tmpl_text;
    /* ids that end generation (sent to the worker with each request) */
    uint32_t stop_ids[64];
    uint32_t n_stop_ids;
    /* the single tokens <think> and </think>, or -1 (usage counts the
     * reasoning's tokens by them) */
    int64_t think_open_id, think_close_id;
};

/* The byte codec: token id = byte value (vocabulary 256), chat rendered as
 * ChatML (or with the config's "chat_template").  It needs no model files;
 * the gateway uses it for models whose config says "tokenizer": "bytes"
 * (the test worker speaks it). */
mr_codec *mr_codec_bytes(void);

/* Opens the codec for a model config entry: "bytes", or "gguf" (the GGUF's
 * own tokenizer and chat template: tmpl_override when not NULL, else the
 * GGUF's tokenizer.chat_template; ChatML only for a model that has neither). */
mr_codec *mr_codec_open(const char *kind, const char *gguf_path, const char *tmpl_override, mr_err *err);

#endif
