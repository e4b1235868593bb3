// Reasoning and tool calls read back from a reply, against the models' own
// chat templates and the official `openai` npm client.
// usage: node serve_tools.mjs BASE_URL TEMPLATES_DIR
//
// Each case is an assistant turn given as structure (reasoning_content,
// content, tool_calls).  The model's real chat template, rendered by the
// reference engine (@huggingface/jinja), writes that turn as the model would
// have generated it.  The gateway's echo models (the byte codec, a template
// that is the last user message, see tests/e2e/serve_tools.sh) then
// "generate" exactly that text, and the reply the gateway parses must be the
// structure the case started from: blocking, and streamed through the
// client's own accumulator (ChatCompletionStream), which checks the
// tool-call deltas' shape.
import OpenAI from 'openai';
import { Template } from '@huggingface/jinja';
import assert from 'node:assert/strict';
import { check, done } from './check.mjs';
import fs from 'node:fs';
import path from 'node:path';

const [base, tdir] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 20000 });

const weather = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Weather of a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string' }, days: { type: 'integer' }, metric: { type: 'boolean' },
        threshold: { type: 'number' }, hours: { type: 'array' }, where: { type: 'object' },
      },
      required: ['city'],
    },
  },
};
const search = {
  type: 'function',
  function: { name: 'search', parameters: { type: 'object', properties: { q: { type: 'string' } } } },
};
const tools = [weather, search];

// The assistant turn the template writes for msg: what follows the last
// "<|im_start|>assistant\n" up to its "<|im_end|>".
function rendered(tmpl, msg) {
  const src = fs.readFileSync(path.join(tdir, tmpl), 'utf8');
  const text = new Template(src).render({
    messages: [{ role: 'user', content: 'What is the weather in Paris?' }, msg],
    tools, add_generation_prompt: false, bos_token: '', eos_token: '',
  });
  const start = text.lastIndexOf('<|im_start|>assistant\n') + '<|im_start|>assistant\n'.length;
  return text.slice(start, text.indexOf('<|im_end|>', start));
}

async function roundTrip(model, tmpl, opensThink, msg, extra = {}) {
  let turn = rendered(tmpl, msg);
  if (opensThink) {
    // the generation prompt already holds "<think>\n": the model goes on from there
    assert.ok(turn.startsWith('<think>\n'), 'the template opens the reasoning: ' + JSON.stringify(turn));
    turn = turn.slice('<think>\n'.length);
  }
  // "@@" ends the echo (a stop string), so the reply ends as a real one does
  const req = {
    model, messages: [{ role: 'user', content: turn + '@@' }], tools, stop: ['@@'], max_tokens: 4000, ...extra,
  };
  const want = msg.tool_calls ?? [];
  const expect = (m, finish, reasoning) => {
    assert.equal(reasoning ?? undefined, msg.reasoning_content || undefined, 'reasoning_content');
    assert.equal(m.content, msg.content ? msg.content : want.length ? null : '', 'content');
    const calls = m.tool_calls ?? [];
    assert.equal(calls.length, want.length, 'number of tool calls');
    calls.forEach((c, i) => {
      assert.equal(c.type, 'function');
      assert.match(c.id, /^call_[0-9a-f]{24}$/);
      assert.equal(c.function.name, want[i].function.name);
      assert.deepEqual(JSON.parse(c.function.arguments), want[i].function.arguments);
    });
    assert.equal(finish, want.length ? 'tool_calls' : 'stop');
  };

  const r = await client.chat.completions.create(req);
  expect(r.choices[0].message, r.choices[0].finish_reason, r.choices[0].message.reasoning_content);

  let reasoning = '';
  const s = client.beta.chat.completions.stream({ ...req, stream: true });
  s.on('chunk', (c) => { reasoning += c.choices[0]?.delta?.reasoning_content ?? ''; });
  const f = await s.finalChatCompletion();
  expect(f.choices[0].message, f.choices[0].finish_reason, reasoning || undefined);
}

const call = (name, args) => ({ type: 'function', function: { name, arguments: args } });

// Qwen3: writes <think> itself, calls as JSON objects ("hermes")
await check('qwen3: reasoning, content and one call', () => roundTrip('qwen3', 'Qwen-Qwen3-0.6B.jinja', false, {
  role: 'assistant', reasoning_content: 'The user wants the weather.\nI have a tool for that.',
  content: 'Let me look it up.', tool_calls: [call('get_weather', { city: 'Paris', days: 3 })],
}));
await check('qwen3: two calls, no content', () => roundTrip('qwen3', 'Qwen-Qwen3-0.6B.jinja', false, {
  role: 'assistant', reasoning_content: 'Two lookups.', content: '',
  tool_calls: [call('get_weather', { city: 'Paris', where: { lat: 48.85, lon: 2.35 } }), call('search', { q: 'Paris "events"\ntoday' })],
}));
await check('qwen3: an answer without a call', () => roundTrip('qwen3', 'Qwen-Qwen3-0.6B.jinja', false, {
  role: 'assistant', reasoning_content: 'Easy.', content: 'It is sunny in Paris <b>today</b>.',
}));
await check('qwen3: parallel_tool_calls false keeps the first call', async () => {
  const msg = {
    role: 'assistant', reasoning_content: 'Two lookups.', content: '',
    tool_calls: [call('get_weather', { city: 'Paris' }), call('search', { q: 'x' })],
  };
  const turn = rendered('Qwen-Qwen3-0.6B.jinja', msg);
  const r = await client.chat.completions.create({
    model: 'qwen3', messages: [{ role: 'user', content: turn + '@@' }], tools, stop: ['@@'], max_tokens: 4000,
    parallel_tool_calls: false,
  });
  assert.equal(r.choices[0].message.tool_calls.length, 1);
  assert.equal(r.choices[0].message.tool_calls[0].function.name, 'get_weather');
});
await check('qwen3: tool_choice none shows the text as it is', async () => {
  const turn = rendered('Qwen-Qwen3-0.6B.jinja', {
    role: 'assistant', content: '', tool_calls: [call('search', { q: 'x' })],
  });
  const r = await client.chat.completions.create({
    model: 'qwen3', messages: [{ role: 'user', content: turn + '@@' }], tools, tool_choice: 'none', stop: ['@@'],
    max_tokens: 4000,
  });
  assert.equal(r.choices[0].message.content, turn.replace(/^<think>\n\n<\/think>\n\n/, ''));
  assert.equal(r.choices[0].message.tool_calls, undefined);
  assert.equal(r.choices[0].finish_reason, 'stop');
});

// Qwen3.5 / 3.6: the generation prompt opens <think>; calls as XML with
// parameter values in text, typed back by the tool's JSON schema
await check('qwen3.5: typed parameters', () => roundTrip('qwen35', 'Qwen3.5-4B.jinja', true, {
  role: 'assistant', reasoning_content: 'Weather for three days, metric.',
  content: 'Checking the forecast.',
  tool_calls: [call('get_weather', {
    city: 'Paris\nÎle-de-France', days: 3, metric: true, threshold: 2.5, hours: [6, 12, 18], where: { lat: 48.85 },
  })],
}));
await check('qwen3.5: two calls without content', () => roundTrip('qwen35', 'Qwen3.5-4B.jinja', true, {
  role: 'assistant', reasoning_content: 'Two.', content: '',
  tool_calls: [call('search', { q: 'a < b && c' }), call('get_weather', { city: 'Lyon', metric: false })],
}));

// Qwen3-Coder: XML calls, no reasoning
await check('qwen3-coder: content and a call', () => roundTrip('coder', 'Qwen3-Coder.jinja', false, {
  role: 'assistant', content: 'I will search.', tool_calls: [call('search', { q: 'memra' })],
}));

done();
