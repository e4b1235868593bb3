// The tool-call grammars (gateway/toolgram.h) against the gateway's own
// reply parser and ajv: random sentences of the grammar of tool_choice
// "required" (schema-grammar --tools ... --sample) are sent through the echo
// engine, which writes back exactly the text it is given; every one must
// come back as one tool call of a listed function whose arguments ajv
// validates against that function's parameters.  Hermes on the model
// "qwen3", qwen3_xml on "coder" (tests/e2e/serve_tools.sh).
// usage: node toolgram_check.mjs BASE_URL SCHEMA_GRAMMAR_BIN
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import assert from 'node:assert/strict';
import Ajv2020 from 'ajv/dist/2020.js';
import { check, done } from './check.mjs';

const [base, bin] = process.argv.slice(2);
const ajv = new Ajv2020({ strict: false });
const dir = mkdtempSync(join(tmpdir(), 'memra-toolgram-'));

const toolSets = {
  mixed: [
    { type: 'function', function: { name: 'note', parameters: { type: 'object', properties: {
      title: { type: 'string' }, body: { type: ['string', 'null'] }, tag: { enum: ['a b', 'c<d', 'x/y'] },
      n: { type: 'integer', minimum: 1, maximum: 20 }, ratio: { type: 'number' }, on: { type: 'boolean' },
      opts: { type: 'object', properties: { x: { type: 'boolean' }, k: { type: 'array', items: { type: 'integer' }, maxItems: 3 } },
        required: ['x'], additionalProperties: false },
      list: { type: 'array', items: { type: 'string', maxLength: 4 }, maxItems: 2 } },
      required: ['title', 'tag'] } } },
    { type: 'function', function: { name: 'ping' } },
    { type: 'function', function: { name: 'pick', parameters: { type: 'object', properties: {
      which: { const: 'null-ish' }, v: { type: ['integer', 'null'] } }, required: ['which', 'v'] } } },
  ],
};

function samples(tools, format, seed, n) {
  const f = join(dir, `tools-${format}.json`);
  writeFileSync(f, JSON.stringify(tools));
  const r = spawnSync(bin, ['--tools', f, '--format', format, '--sample', String(n), '--seed', String(seed), '-z'],
    { encoding: 'utf8', maxBuffer: 64 << 20 });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.split('\0').filter((s) => s.length);
}

// the echo engine repeats its prompt: a stop string ends the reply (one no
// sentence here holds)
const END = '\u0007@@end@@\u0007';

async function echoed(model, tools, text) {
  assert.ok(!text.includes(END));
  const body = { model, messages: [{ role: 'user', content: text + END }], tools, tool_choice: 'auto',
    stop: [END], max_tokens: Buffer.byteLength(text) + 16 };
  const r = await fetch(base + '/v1/chat/completions', { method: 'POST', body: JSON.stringify(body) });
  assert.equal(r.status, 200);
  return r.json();
}

for (const [format, model] of [['hermes', 'qwen3'], ['qwen3_xml', 'coder']]) {
  for (const [set, tools] of Object.entries(toolSets)) {
    await check(`${format} ${set}: 60 sampled sentences read back as valid calls`, async () => {
      const params = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters ?? { type: 'object' }]));
      const texts = samples(tools, format, 7, 60);
      assert.ok(texts.length >= 30, `only ${texts.length} walks ended`);
      for (const text of texts) {
        const r = await echoed(model, tools, text);
        const ch = r.choices[0];
        assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify({ text, message: ch.message }));
        assert.equal(ch.message.tool_calls.length, 1);
        const fn = ch.message.tool_calls[0].function;
        assert.ok(fn.name in params, fn.name);
        const args = JSON.parse(fn.arguments);
        assert.ok(ajv.validate(params[fn.name], args), `${JSON.stringify(text)} -> ${fn.arguments}: ${ajv.errorsText()}`);
      }
    });
  }
}

done();
