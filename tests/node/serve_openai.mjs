// Drives a running memra gateway with the official `openai` npm client.
// usage: node serve_openai.mjs BASE_URL MODEL [API_KEY]
// The model is the echo test engine behind the byte codec: output token i
// is prompt token i mod n, so every expected text follows from the prompt.
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { check, done } from './check.mjs';

const [base, model, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + '/v1', apiKey: key || 'none', maxRetries: 0, timeout: 20000 });
const repeat = (p, n) => p.repeat(Math.ceil(n / p.length)).slice(0, n);

await check('completions, blocking, usage', async () => {
  const r = await client.completions.create({ model, prompt: 'hello ', max_tokens: 12 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].text, 'hello hello ');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.deepEqual(r.usage, { prompt_tokens: 6, completion_tokens: 12, total_tokens: 18, prompt_tokens_details: { cached_tokens: 0 } });
});

await check('chat, blocking', async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, '<|im_');
  assert.equal(r.usage.completion_tokens, 5);
});

await check('chat, streaming with include_usage', async () => {
  const s = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 9, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', role = null, finish = null, usage = null, n = 0;
  for await (const c of s) {
    n++;
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    const d = c.choices[0].delta;
    if (d.role) role = d.role;
    if (d.content) text += d.content;
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, '<|im_star');
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 9);
  assert.ok(n >= 10);
});

await check('completions, streaming, stop string', async () => {
  const s = await client.completions.create({ model, prompt: 'one two three', max_tokens: 40, stream: true, stop: ['three'] });
  let text = '', finish = null;
  for await (const c of s) {
    text += c.choices[0]?.text || '';
    if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.equal(text, 'one two ');
  assert.equal(finish, 'stop');
});

await check('seed and temperature 0 give identical results', async () => {
  const a = await client.completions.create({ model, prompt: 'abc', max_tokens: 10, seed: 7, temperature: 0 });
  const b = await client.completions.create({ model, prompt: 'abc', max_tokens: 10, seed: 7, temperature: 0 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.equal(a.choices[0].text, repeat('abc', 10));
});

await check('chat logprobs', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'x' }], max_tokens: 3, logprobs: true, top_logprobs: 3,
  });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 3);
  assert.deepEqual(lp.map((t) => t.token), ['<', '|', 'i']);
  assert.deepEqual(lp.map((t) => t.logprob), [0, -0.25, -0.5]);
  assert.equal(lp[0].top_logprobs.length, 3);
  assert.deepEqual(lp[0].bytes, [60]);
});

await check('n=2 is a 400 naming the parameter', async () => {
  await assert.rejects(client.completions.create({ model, prompt: 'x', n: 2 }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, 'n');
    assert.equal(e.type, 'invalid_request_error');
    return true;
  });
});

await check('unknown model is a 404', async () => {
  await assert.rejects(client.completions.create({ model: 'no-such-model', prompt: 'x' }), (e) => {
    assert.equal(e.status, 404);
    assert.equal(e.code, 'model_not_found');
    return true;
  });
});

await check('models list', async () => {
  const list = [];
  for await (const m of client.models.list()) list.push(m.id);
  assert.ok(list.includes(model));
});

done();
