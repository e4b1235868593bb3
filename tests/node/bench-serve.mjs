// bench-serve: closed-loop serving benchmark against a running gateway.
//
//   node bench-serve.mjs URL MODEL -c C -r R -p P -n N [--shared S] [--vocab V]
//                        [--key KEY] [--seed X] [--label TEXT]
//
// C clients keep one streaming /v1/completions request each in flight until R
// requests have completed.  Each prompt is P token ids (the first S of them
// the same for every request, the rest drawn from [0, V) by a seeded
// generator), max_tokens N, temperature 0.  A 429 is counted and the client
// waits its Retry-After (at most 1 s) before trying again.  Prints one JSON
// line: completed and refused counts, wall time, aggregate output tok/s,
// requests/s, and p50/p99 of time to first token, inter-token latency and
// request latency (seconds; TTFT and latency count from the admitted attempt),
// p99 of the time a refused attempt took to get its 429, prompt and cached
// prompt tokens from usage.
const args = process.argv.slice(2);
const [base, model] = args;
const opt = (name, def) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : def;
};
const C = Number(opt('-c', 1)), R = Number(opt('-r', 8)), P = Number(opt('-p', 512));
const N = Number(opt('-n', 128)), S = Number(opt('--shared', 0)), V = Number(opt('--vocab', 1000));
const key = opt('--key', ''), label = opt('--label', '');
// a distinct nonzero state for every seed (seed | 1 made 2 and 3 one
// stream, so a sweep's points shared prompts and hit the prefix cache)
let seed = ((BigInt(opt('--seed', 1)) << 1n) | 1n) & 0xffffffffffffffffn;
if (!base || !model || !(C >= 1) || !(R >= 1) || !(P >= 1) || !(N >= 1) || S > P || !(V >= 2)) {
  console.error('usage: node bench-serve.mjs URL MODEL -c C -r R -p P -n N [--shared S] [--vocab V] [--key K]');
  process.exit(2);
}
const rnd = () => { // xorshift64*: the same prompts for the same seed
  seed ^= seed >> 12n; seed ^= (seed << 25n) & 0xffffffffffffffffn; seed ^= seed >> 27n;
  return Number(((seed * 0x2545f4914f6cdd1dn) & 0xffffffffffffffffn) >> 11n) / 2 ** 53;
};
const shared = Array.from({ length: S }, () => Math.floor(rnd() * V));
const prompts = Array.from({ length: R }, () =>
  shared.concat(Array.from({ length: P - S }, () => Math.floor(rnd() * V))));

const headers = { 'content-type': 'application/json' };
if (key) headers.authorization = `Bearer ${key}`;
const ttft = [], itl = [], lat = [], refusedLat = [];
let next = 0, done = 0, refused = 0, errors = 0, outTok = 0, promptTok = 0, cachedTok = 0;
const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

async function request(prompt) {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers,
    body: JSON.stringify({ model, prompt, max_tokens: N, temperature: 0, stream: true,
                           stream_options: { include_usage: true } }),
  });
  if (r.status === 429) {
    await r.text();
    refused++;
    refusedLat.push((performance.now() - t0) / 1000);
    await sleep(Math.min(1000, 1000 * Number(r.headers.get('retry-after') || 0.05)));
    return false;
  }
  if (r.status !== 200) {
    errors++;
    console.error(`bench-serve: HTTP ${r.status}: ${(await r.text()).slice(0, 200)}`);
    return true;
  }
  const reader = r.body.getReader(), dec = new TextDecoder();
  let buf = '', last = 0, first = 0, usage = null, finished = false;
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    buf += dec.decode(value, { stream: true });
    let at;
    while ((at = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, at);
      buf = buf.slice(at + 2);
      if (!ev.startsWith('data: ')) continue;
      const data = ev.slice(6);
      if (data === '[DONE]') { finished = true; continue; }
      const j = JSON.parse(data);
      if (j.error) { errors++; return true; }
      if (j.usage) usage = j.usage;
      // every chunk before the finishing one carries tokens (its text may be
      // empty: a partial character or a control token)
      if (j.choices?.length && j.choices[0].text !== undefined && !j.choices[0].finish_reason) {
        const now = performance.now();
        if (!first) first = now;
        else itl.push((now - last) / 1000);
        last = now;
      }
    }
  }
  if (!finished || !usage) { errors++; return true; }
  ttft.push(((first || performance.now()) - t0) / 1000);
  lat.push((performance.now() - t0) / 1000);
  outTok += usage.completion_tokens;
  promptTok += usage.prompt_tokens;
  cachedTok += usage.prompt_tokens_details?.cached_tokens || 0;
  done++;
  return true;
}

async function client() {
  while (next < R) {
    const i = next++;
    try {
      while (!(await request(prompts[i]))) { /* refused: try again */ }
    } catch (e) {
      errors++;
      console.error(`bench-serve: ${e.message}`);
    }
  }
}

const pct = (v, q) => {
  if (!v.length) return null;
  const s = [...v].sort((a, b) => a - b);
  return Number(s[Math.min(s.length - 1, Math.floor(q * s.length))].toFixed(4));
};
const t0 = performance.now();
await Promise.all(Array.from({ length: C }, client));
const wall = (performance.now() - t0) / 1000;
console.log(JSON.stringify({
  label, c: C, requests: R, prompt: P, shared: S, max_tokens: N, completed: done, refused_429: refused,
  errors, wall_s: Number(wall.toFixed(3)), output_tok_s: Number((outTok / wall).toFixed(1)),
  req_s: Number((done / wall).toFixed(3)), ttft_p50: pct(ttft, 0.5), ttft_p99: pct(ttft, 0.99),
  itl_p50: pct(itl, 0.5), itl_p99: pct(itl, 0.99), latency_p50: pct(lat, 0.5), latency_p99: pct(lat, 0.99),
  refused_p99: pct(refusedLat, 0.99),
  prompt_tokens: promptTok, cached_prompt_tokens: cachedTok, output_tokens: outTok,
}));
process.exit(errors ? 1 : 0);
