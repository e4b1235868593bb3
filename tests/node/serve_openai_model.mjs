// The official `openai` client against the gateway serving a real model
// (the qwen3 fixture on the CPU backend): seeds repeat, greedy is stable,
// chat and streaming carry usage, logprobs come back.
// usage: node serve_openai_model.mjs BASE_URL MODEL
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { check, done } from './check.mjs';

const [base, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000 });

await check('same seed, same sampled completion', async () => {
  const req = { model, prompt: 'The quick brown fox', max_tokens: 16, temperature: 0.9, seed: 11 };
  const a = await client.completions.create(req);
  const b = await client.completions.create(req);
  assert.equal(a.usage.completion_tokens, b.usage.completion_tokens);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

await check('greedy chat is stable and reports usage', async () => {
  const req = { model, messages: [{ role: 'user', content: 'Say something.' }], max_tokens: 8, temperature: 0 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.ok(a.usage.prompt_tokens > 5);
  assert.equal(a.usage.total_tokens, a.usage.prompt_tokens + a.usage.completion_tokens);
  assert.ok(['stop', 'length'].includes(a.choices[0].finish_reason));
});

await check('streamed chat equals blocking chat (greedy)', async () => {
  const req = { model, messages: [{ role: 'user', content: 'Count with me.' }], max_tokens: 12, temperature: 0 };
  const blocking = await client.chat.completions.create(req);
  const s = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    if (c.choices.length && c.choices[0].delta.content) text += c.choices[0].delta.content;
  }
  assert.equal(text, blocking.choices[0].message.content);
  // the same prompt again: the worker's prefix cache serves its full
  // 16-token KV blocks, up to but not including the last prompt token
  // (always computed, for its logits); the counts are otherwise the same
  const { prompt_tokens_details: pd, ...rest } = usage;
  const { prompt_tokens_details: _bd, ...brest } = blocking.usage;
  assert.deepEqual(rest, brest);
  assert.equal(pd.cached_tokens, Math.floor((usage.prompt_tokens - 1) / 16) * 16);
});

await check('logprobs are log-probabilities, best first', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'x' }], max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 5,
  });
  for (const t of r.choices[0].logprobs.content) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 5);
    // greedy: the chosen token is the most likely one
    assert.equal(t.top_logprobs[0].logprob, t.logprob);
    for (let i = 1; i < 5; i++) assert.ok(t.top_logprobs[i].logprob <= t.top_logprobs[i - 1].logprob);
    const mass = t.top_logprobs.reduce((s, x) => s + Math.exp(x.logprob), 0);
    assert.ok(mass <= 1.0001);
  }
});

done();
