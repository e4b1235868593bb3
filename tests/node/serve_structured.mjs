// Structured output through the gateway on a real model (the qwen3
// fixture on the CPU backend, random weights: what it writes is noise, so
// only a grammar makes it valid), driven by the official openai client and
// checked by ajv, a JSON Schema validator that is not ours:
// - response_format json_schema: every reply that ends ("stop") is JSON
//   that ajv validates against the schema, greedy and sampled, streamed
//   and blocking (the stream adds up to the blocking reply);
// - response_format json_object: a JSON object;
// - grammar (GBNF): a sentence of it;
// - tool_choice "required" / a named function: tool_calls only, each
//   call's arguments valid under its tool's parameters;
// - what cannot be kept is a 400 naming the field.
// The tool checks run on a second model too, in the qwen3_xml format.
// usage: node serve_structured.mjs BASE_URL MODEL [XML_MODEL]
import OpenAI from 'openai';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import assert from 'node:assert/strict';
import { check, done } from './check.mjs';

const [base, model, xmlModel] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 });
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

// bounded schemas: every walk through them ends within max_tokens
const person = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 6 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    role: { enum: ['admin', 'user', null] },
    ok: { type: 'boolean' },
  },
  required: ['name', 'age', 'role', 'ok'],
  additionalProperties: false,
};
const point = {
  type: 'object',
  properties: { x: { type: 'integer', minimum: -99, maximum: 99 }, tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 3 } },
  required: ['x', 'tags'],
  additionalProperties: false,
};
const choice = { anyOf: [{ const: 'red' }, { type: 'integer', minimum: 1, maximum: 9 }, { type: 'null' }] };

const chat = (content, extra) => ({ model, messages: [{ role: 'user', content }], max_tokens: 96, ...extra });
const fmt = (schema) => ({ type: 'json_schema', json_schema: { name: 'out', schema, strict: true } });

async function streamed(req) {
  const s = await client.chat.completions.create({ ...req, stream: true });
  let text = '', finish = null;
  const calls = [];
  for await (const c of s) {
    const ch = c.choices[0];
    if (!ch) continue;
    if (ch.delta.content) text += ch.delta.content;
    for (const tc of ch.delta.tool_calls ?? []) {
      calls[tc.index] ??= { name: '', arguments: '' };
      if (tc.function?.name) calls[tc.index].name += tc.function.name;
      if (tc.function?.arguments) calls[tc.index].arguments += tc.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { text, finish, calls };
}

function validates(schema, text) {
  const v = JSON.parse(text);
  const ok = ajv.validate(schema, v);
  assert.ok(ok, `${text}: ${ajv.errorsText()}`);
  return v;
}

for (const [name, schema] of [['person', person], ['point', point], ['anyOf', choice]]) {
  await check(`json_schema ${name}: greedy and 6 seeds validate, stream = blocking`, async () => {
    for (const seed of [null, 1, 2, 3, 4, 5, 6]) {
      const req = chat(`Give me a ${name}.`, seed === null ? { temperature: 0 } : { temperature: 1.0, seed });
      req.response_format = fmt(schema);
      const r = await client.chat.completions.create(req);
      const ch = r.choices[0];
      assert.equal(ch.finish_reason, 'stop', `seed ${seed}: ${ch.message.content}`);
      validates(schema, ch.message.content);
      const s = await streamed(req);
      assert.equal(s.text, ch.message.content);
      assert.equal(s.finish, 'stop');
    }
  });
}

await check('json_object: a JSON object (or a prefix of one, cut by max_tokens)', async () => {
  let ended = 0;
  for (const seed of [1, 2, 3, 4]) {
    const r = await client.chat.completions.create(
      chat('JSON please', { temperature: 0.8, seed, max_tokens: 64, response_format: { type: 'json_object' } }));
    const ch = r.choices[0];
    assert.ok(ch.message.content.startsWith('{'), ch.message.content);
    if (ch.finish_reason === 'stop') {
      ended++;
      const v = JSON.parse(ch.message.content);
      assert.equal(typeof v, 'object');
      assert.ok(v !== null && !Array.isArray(v));
    } else {
      assert.equal(ch.finish_reason, 'length');
    }
  }
  console.log(`  (${ended} of 4 ended within 64 tokens)`);
});

await check('grammar (GBNF) on completions and chat', async () => {
  const grammar = 'root ::= "The answer is " ("yes" | "no") "."';
  const c = await client.completions.create({ model, prompt: 'Q: is it? A:', max_tokens: 32, temperature: 1.0, seed: 3, grammar });
  assert.match(c.choices[0].text, /^The answer is (yes|no)\.$/);
  assert.equal(c.choices[0].finish_reason, 'stop');
  const r = await client.chat.completions.create(chat('?', { temperature: 0, grammar: 'root ::= [0-9]{4} "-" [0-9]{2}' }));
  assert.match(r.choices[0].message.content, /^[0-9]{4}-[0-9]{2}$/);
});

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { enum: ['Paris', 'Oslo'] }, days: { type: 'integer', minimum: 1, maximum: 7 } },
      required: ['city', 'days'], additionalProperties: false } } },
  { type: 'function', function: { name: 'add', description: 'Adds',
    parameters: { type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 9 }, b: { type: 'integer', minimum: 0, maximum: 9 } },
      required: ['a', 'b'], additionalProperties: false } } },
];
const paramsOf = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters]));

for (const m of [model, xmlModel].filter(Boolean)) {
  const call = (content, extra) => ({ ...chat(content, extra), model: m });
  await check(`${m}: tool_choice "required": tool calls only, arguments valid, stream = blocking`, async () => {
    for (const seed of [1, 2, 3, 4]) {
      const req = call('Do something.', { temperature: 1.0, seed, tools, tool_choice: 'required', parallel_tool_calls: false, max_tokens: 256 });
      const r = await client.chat.completions.create(req);
      const msg = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(msg));
      assert.equal(msg.content, null);
      assert.equal(msg.tool_calls.length, 1);
      const fn = msg.tool_calls[0].function;
      assert.ok(fn.name in paramsOf, fn.name);
      validates(paramsOf[fn.name], fn.arguments);
      const s = await streamed(req);
      assert.equal(s.finish, 'tool_calls');
      assert.deepEqual(s.calls, [{ name: fn.name, arguments: fn.arguments }]);
    }
  });

  await check(`${m}: tool_choice naming a function: that function`, async () => {
    for (const seed of [1, 2]) {
      const r = await client.chat.completions.create(call('Add.', {
        temperature: 1.0, seed, tools, tool_choice: { type: 'function', function: { name: 'add' } }, max_tokens: 256 }));
      const calls = r.choices[0].message.tool_calls;
      assert.equal(calls.length, 1);
      assert.equal(calls[0].function.name, 'add');
      validates(paramsOf.add, calls[0].function.arguments);
    }
  });
}

if (xmlModel) {
  await check(`${xmlModel}: string parameters are text, never "null" unless null is allowed`, async () => {
    const textTools = [{ type: 'function', function: { name: 'note', parameters: { type: 'object',
      properties: { title: { type: 'string' }, body: { type: ['string', 'null'] }, tag: { enum: ['a b', 'c<d'] } },
      required: ['title', 'tag'] } } }];
    let ended = 0;
    for (const seed of [1, 2, 3, 4, 5, 6]) {
      const r = await client.chat.completions.create({ ...chat('Note.', {
        temperature: 1.0, seed, tools: textTools, tool_choice: 'required', parallel_tool_calls: false, max_tokens: 200 }), model: xmlModel });
      const ch = r.choices[0];
      if (ch.finish_reason === 'length') continue; // a long text cut by max_tokens
      ended++;
      assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(ch.message));
      validates(textTools[0].function.parameters, ch.message.tool_calls[0].function.arguments);
    }
    console.log(`  (${ended} of 6 ended within 200 tokens)`);
  });
}

async function status400(req, param) {
  const r = await fetch(base + '/v1/chat/completions', { method: 'POST', body: JSON.stringify(req) });
  const body = await r.json();
  assert.equal(r.status, 400, JSON.stringify(body));
  assert.equal(body.error.param, param);
  return body.error.message;
}

await check('what cannot be kept is a 400 naming the field', async () => {
  let msg = await status400(chat('x', { response_format: fmt({ type: 'integer', multipleOf: 7 }) }), 'response_format');
  assert.match(msg, /multipleOf/);
  msg = await status400(chat('x', { grammar: 'root ::= undefined-rule' }), 'grammar');
  assert.match(msg, /undefined-rule/);
  await status400(chat('x', { response_format: { type: 'xml' } }), 'response_format');
  await status400(chat('x', { tools, tool_choice: { type: 'function', function: { name: 'nope' } } }), 'tool_choice');
  await status400(chat('x', { tool_choice: 'required' }), 'tool_choice');
  await status400(chat('x', { response_format: { type: 'json_object' }, enable_thinking: true }), 'response_format');
  await status400(chat('x', { response_format: { type: 'json_object' }, grammar: 'root ::= "a"' }), 'grammar');
});

done();
