// JSON Schema grammars (gateway/jsonschema.h) against a real validator, ajv.
// usage: node schema_check.mjs SCHEMA_GRAMMAR_BIN [CORPUS.json]
//
// For every schema of the corpus (tests/node/schemas.json):
//  - soundness: sentences sampled from the grammar (schema-grammar --sample)
//    are JSON texts that ajv finds valid;
//  - completeness: the hand-written valid instances, compact and indented,
//    are accepted by the grammar (schema-grammar --check), and ajv agrees
//    they are valid;
//  - the hand-written invalid instances are rejected by both;
//  - a schema marked "refused" is refused, with an error naming what.
// Then random schemas made of the supported keywords (a fixed seed, or
// SCHEMA_RANDOM_SEED; SCHEMA_RANDOM_COUNT of them): each one the grammar
// takes must have only valid samples.
// ajv is the draft 2020-12 one unless the schema's $schema says draft-07;
// everything is checked by the draft-07 one too where the schema has no
// keyword whose meaning differs there (clients rarely say which draft
// they mean).  Formats are checked with ajv-formats.
import Ajv from 'ajv';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { check, done } from './check.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const [bin, corpusPath = path.join(here, 'schemas.json')] = process.argv.slice(2);
if (!bin) {
  console.error('usage: node schema_check.mjs SCHEMA_GRAMMAR_BIN [CORPUS.json]');
  process.exit(2);
}
const SAMPLES = 200;
const FORMATS = ['date', 'time', 'date-time', 'uuid', 'ipv4', 'ipv6', 'hostname', 'email', 'duration', 'uri'];
const corpus = JSON.parse(fs.readFileSync(corpusPath, 'utf8'));
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'schema-check-'));

// The 2020-12 validator, or the draft-07 one where $schema says so; the
// draft-07 one as well where no keyword of the schema means something
// else there.
function validators(schema) {
  const text = JSON.stringify(schema);
  const draft7 = typeof schema === 'object' && /draft-07/.test(schema.$schema || '');
  const both = !draft7 && !/"(prefixItems|unevaluatedProperties|unevaluatedItems)"/.test(text);
  const out = [];
  for (const [label, Cls] of [['2020-12', Ajv2020], ['draft-07', Ajv]]) {
    if (label === '2020-12' ? draft7 : !draft7 && !both) continue;
    const ajv = new Cls({ strict: false, logger: false });
    addFormats(ajv, FORMATS);
    out.push({ label, validate: ajv.compile(schema) });
  }
  return out;
}

function run(args, input) {
  const r = spawnSync(bin, args, { input, maxBuffer: 64 << 20 });
  return { status: r.status, stdout: r.stdout.toString('utf8'), stderr: r.stderr.toString('utf8') };
}

function seedOf(name) {
  let h = 7;
  for (const ch of name) h = (h * 31 + ch.codePointAt(0)) % 1000003;
  return String(h + 1);
}

function invalidUnder(vs, value) {
  return vs.filter((v) => !v.validate(value)).map((v) => v.label + ' ' + JSON.stringify(v.validate.errors));
}

// texts separated by NUL bytes -> accept/reject per text
function grammarAccepts(file, texts) {
  if (!texts.length) return [];
  const r = run([file, '--check', '-z'], texts.map((t) => t + '\0').join(''));
  if (r.status !== 0) throw new Error('schema-grammar --check failed: ' + r.stderr);
  const lines = r.stdout.trim().split('\n');
  if (lines.length !== texts.length) throw new Error(`--check answered ${lines.length} of ${texts.length}`);
  return lines.map((l) => l === 'accept');
}

function checkSamples(c, file, vs) {
  const r = run([file, '--sample', String(SAMPLES), '--seed', seedOf(c.name), '-z']);
  if (r.status !== 0) throw new Error('--sample failed: ' + r.stderr);
  const texts = r.stdout.split('\0').slice(0, -1);
  if (texts.length !== SAMPLES) throw new Error(`${texts.length} samples, not ${SAMPLES}`);
  const bad = [];
  for (const t of texts) {
    let v;
    try {
      v = JSON.parse(t);
    } catch (e) {
      bad.push(`not JSON: ${JSON.stringify(t)}`);
      continue;
    }
    const why = invalidUnder(vs, v);
    if (why.length) bad.push(`${JSON.stringify(t)}: ${why.join('; ')}`);
  }
  if (bad.length) throw new Error(`${bad.length} invalid samples, e.g.\n  ` + bad.slice(0, 5).join('\n  '));
  return new Set(texts).size;
}

function checkValid(c, file, vs) {
  const texts = [];
  for (const v of c.valid || []) {
    const why = invalidUnder(vs, v);
    if (why.length) throw new Error(`corpus: ${JSON.stringify(v)} is not valid: ${why.join('; ')}`);
    texts.push(JSON.stringify(v), JSON.stringify(v, null, 2), JSON.stringify(v, null, '\t'));
  }
  for (const t of c.valid_texts || []) texts.push(t);
  const ok = grammarAccepts(file, texts);
  const missed = texts.filter((t, i) => !ok[i]);
  if (missed.length) throw new Error('grammar rejects valid ' + missed.map((t) => JSON.stringify(t)).join(', '));
}

function checkInvalid(c, file, vs) {
  const texts = [];
  for (const v of c.invalid || []) {
    if (!invalidUnder(vs, v).length) throw new Error(`corpus: ${JSON.stringify(v)} is valid`);
    texts.push(JSON.stringify(v));
  }
  for (const t of c.invalid_texts || []) texts.push(t);
  const ok = grammarAccepts(file, texts);
  const passed = texts.filter((t, i) => ok[i]);
  if (passed.length) throw new Error('grammar accepts invalid ' + passed.map((t) => JSON.stringify(t)).join(', '));
}

let i = 0;
for (const c of corpus) {
  const file = path.join(tmp, `s${i++}.json`);
  fs.writeFileSync(file, JSON.stringify(c.schema));
  if (c.refused) {
    await check(`${c.name}: refused naming ${c.refused}`, () => {
      const r = run([file]);
      if (r.status !== 1 || !r.stderr.includes(c.refused))
        throw new Error(`status ${r.status}, stderr ${JSON.stringify(r.stderr)}`);
    });
    continue;
  }
  await check(`${c.name}: grammar, samples, instances`, () => {
    const vs = validators(c.schema);
    const g = run([file]);
    if (g.status !== 0) throw new Error('refused: ' + g.stderr);
    const distinct = checkSamples(c, file, vs);
    checkValid(c, file, vs);
    checkInvalid(c, file, vs);
    if (distinct < Math.min(c.min_distinct ?? 5, SAMPLES)) throw new Error(`only ${distinct} distinct samples`);
  });
}
// ---- random schemas ----

function rng(seed) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x / 4294967296;
  };
}

function randomSchemas(count, seed) {
  const r = rng(seed);
  const pick = (a) => a[Math.floor(r() * a.length)];
  const int = (lo, hi) => lo + Math.floor(r() * (hi - lo + 1));
  const names = ['a', 'ab', 'abc', 'b', 'x y', 'é', 'k"q', 'n/m', 'id', 'idx'];
  const patterns = ['^[a-z]+$', '^\\d{2,4}$', 'ab', '^(x|yz)*$', '^[^"\\\\]{0,3}$', '^.$', '\\s', '^[A-F0-9]{2}(-[A-F0-9]{2})?$'];
  const value = (d) => {
    const k = int(0, d > 1 ? 5 : 7);
    if (k === 0) return null;
    if (k === 1) return r() < 0.5;
    if (k === 2) return int(-20, 20);
    if (k === 3) return int(-100, 100) / 8;
    if (k === 4 || k === 5) return pick(['', 'a', 'ab', 'é😀', 'q"\\', '12', 'x y']);
    if (k === 6) return Array.from({ length: int(0, 2) }, () => value(d + 1));
    return Object.fromEntries(Array.from({ length: int(0, 2) }, () => [pick(names), value(d + 1)]));
  };
  const defs = {};
  const schema = (d) => {
    const k = int(0, d > 3 ? 8 : 15);
    const s = {};
    if (k === 0) return r() < 0.9;
    if (k === 1) s.type = pick(['null', 'boolean', 'integer', 'number', 'string', ['integer', 'string'], ['number', 'null']]);
    if (k === 2) s.enum = Array.from({ length: int(1, 4) }, () => value(0));
    if (k === 3) s.const = value(0);
    if (k === 4) {
      s.type = pick(['integer', 'number']);
      const lo = int(-30, 30), hi = lo + int(0, 60);
      if (r() < 0.7) s[pick(['minimum', 'exclusiveMinimum'])] = s.type === 'integer' && r() < 0.3 ? lo + 0.5 : lo;
      if (r() < 0.7) s[pick(['maximum', 'exclusiveMaximum'])] = hi;
      if (r() < 0.2) s.multipleOf = 1;
    }
    if (k === 5) {
      s.type = 'string';
      if (r() < 0.5) s.minLength = int(0, 3);
      if (r() < 0.5) s.maxLength = int(2, 6);
      if (r() < 0.4) s.pattern = pick(patterns);
      else if (r() < 0.3) s.format = pick(['date', 'time', 'date-time', 'uuid', 'email', 'ipv4', 'ipv6', 'hostname', 'duration', 'uri', 'regex']);
    }
    if (k === 6 || k === 7) {
      s.type = 'array';
      const tuple = Array.from({ length: int(1, 3) }, () => schema(d + 1));
      const t = r();
      if (t < 0.4) s.prefixItems = tuple;
      if (t > 0.8) s.items = tuple; /* draft-07 form */
      else if (r() < 0.7) s.items = schema(d + 1);
      if (t > 0.8 && r() < 0.6) s.additionalItems = schema(d + 1);
      if (r() < 0.4) s.minItems = int(0, 2);
      if (r() < 0.4) s.maxItems = int(1, 4);
      if (r() < 0.2) s.uniqueItems = true;
      if (r() < 0.1) s.unevaluatedItems = schema(d + 1);
    }
    if (k >= 8 && k <= 10) {
      s.type = 'object';
      s.properties = {};
      for (let i = int(0, 3); i > 0; i--) s.properties[pick(names)] = schema(d + 1);
      const req = Object.keys(s.properties).filter(() => r() < 0.5);
      if (r() < 0.2) req.push(pick(names));
      if (req.length) s.required = [...new Set(req)];
      const ap = r();
      if (ap < 0.3) s.additionalProperties = false;
      else if (ap < 0.45) s.additionalProperties = true;
      else if (ap < 0.6) s.additionalProperties = schema(d + 1);
      else if (ap < 0.7) s.unevaluatedProperties = r() < 0.5 ? false : schema(d + 1);
    }
    if (k === 11) s.anyOf = Array.from({ length: int(1, 3) }, () => schema(d + 1));
    if (k === 12) s.allOf = Array.from({ length: int(1, 3) }, () => schema(d + 1));
    if (k === 13) s.oneOf = Array.from({ length: int(2, 3) }, () => schema(d + 1));
    if (k === 14 || k === 15) {
      const name = 'd' + int(0, 3);
      if (!(name in defs)) {
        defs[name] = {};
        defs[name] = schema(d + 1);
      }
      s.$ref = '#/$defs/' + name;
      if (r() < 0.3) s.type = pick(['object', 'array', 'string', ['integer', 'null']]);
    }
    if (r() < 0.15 && typeof s === 'object') s.nullable = true;
    if (r() < 0.1) s.description = 'annotation';
    return s;
  };
  const out = [];
  for (let i = 0; i < count; i++) {
    for (const k of Object.keys(defs)) delete defs[k];
    const s = schema(0);
    const root = typeof s === 'object' ? { ...s } : { allOf: [s] };
    if (Object.keys(defs).length) root.$defs = { ...defs };
    if (r() < 0.15) root.$schema = 'http://json-schema.org/draft-07/schema#';
    if (r() < 0.1) root.properties = { ...(root.properties || {}), self: { anyOf: [{ $ref: '#' }, { type: 'null' }] } };
    out.push(root);
  }
  return out;
}

await check('random schemas: every sample valid', () => {
  let taken = 0, refusedCount = 0;
  const bad = [];
  const count = Number(process.env.SCHEMA_RANDOM_COUNT || 300), seed = Number(process.env.SCHEMA_RANDOM_SEED || 20240601);
  for (const [i, schema] of randomSchemas(count, seed).entries()) {
    let vs;
    try {
      vs = validators(schema);
    } catch (e) {
      continue; /* not a schema ajv takes */
    }
    const file = path.join(tmp, `r${i}.json`);
    fs.writeFileSync(file, JSON.stringify(schema));
    const r = run([file, '--sample', '30', '--seed', String(i + 1), '-z']);
    if (r.status !== 0) {
      refusedCount++;
      if (!/schema-grammar: /.test(r.stderr)) bad.push(`${JSON.stringify(schema)}: ${r.stderr}`);
      continue;
    }
    taken++;
    for (const t of r.stdout.split('\0').slice(0, -1)) {
      let v;
      try {
        v = JSON.parse(t);
      } catch (e) {
        bad.push(`${JSON.stringify(schema)}: not JSON: ${JSON.stringify(t)}`);
        continue;
      }
      const why = invalidUnder(vs, v);
      if (why.length) bad.push(`${JSON.stringify(schema)}: ${JSON.stringify(t)}: ${why.join('; ')}`);
    }
  }
  console.log(`random schemas: ${taken} compiled, ${refusedCount} refused or without samples`);
  if (bad.length) throw new Error(`${bad.length} failures, e.g.\n  ` + bad.slice(0, 5).join('\n  '));
  if (taken < 100) throw new Error(`only ${taken} random schemas compiled`);
});

fs.rmSync(tmp, { recursive: true, force: true });
done();
