// Load generator for the serving tests: C concurrent clients for S seconds,
// alternating blocking chat and streaming completions; prints a JSON tally
// of HTTP statuses (and of malformed responses).
// usage: node load.mjs BASE_URL MODEL CLIENTS SECONDS
const [base, model, clients, seconds] = process.argv.slice(2);
const end = Date.now() + Number(seconds) * 1000;
const tally = {};
const bump = (k) => { tally[k] = (tally[k] || 0) + 1; };

async function one(i, n) {
  const stream = n % 2 === 0;
  const body = stream
    ? { model, prompt: `c${i}-`, max_tokens: 16, stream: true }
    : { model, messages: [{ role: 'user', content: `c${i}` }], max_tokens: 16 };
  const r = await fetch(base + (stream ? '/v1/completions' : '/v1/chat/completions'), {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  const text = await r.text();
  if (r.status === 200) {
    const ok = stream ? text.trimEnd().endsWith('data: [DONE]') : JSON.parse(text).choices?.[0]?.finish_reason;
    bump(ok ? '200' : 'malformed-200');
  } else {
    let shaped = false;
    try { shaped = typeof JSON.parse(text).error?.message === 'string'; } catch { /* not JSON */ }
    bump(shaped ? String(r.status) : `${r.status}-unshaped`);
    if (r.status === 429) await new Promise((res) => setTimeout(res, 20));
  }
}

async function client(i) {
  for (let n = 0; Date.now() < end; n++) {
    try {
      await one(i, n);
    } catch (e) {
      bump('transport-error');
    }
  }
}
await Promise.all(Array.from({ length: Number(clients) }, (_, i) => client(i)));
console.log(JSON.stringify(tally));
