// Reference renderer for chat templates: @huggingface/jinja.
//   node render.mjs TEMPLATE.jinja CONTEXT.json
//       prints the rendering (no newline added); exits 1 with the message on
//       stderr when the template fails to parse or raises.
//   node render.mjs --batch TEMPLATES_DIR CORPUS.json OUT_DIR
//       for every case of the corpus writes OUT_DIR/ctx/CASE.json (the
//       variables) and, for every TEMPLATES_DIR/*.jinja, OUT_DIR/exp/NAME/CASE.txt
//       (the rendering) or OUT_DIR/exp/NAME/CASE.err (the error message).
//   node render.mjs --cases CASES.json
//       checks the engine unit cases (tests/unit/jinja-cases.json) against the
//       reference: each expected text must be what the reference renders, each
//       expected error must be an error here too ("extension" cases are
//       jinja2 features the reference lacks, and are skipped).
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";

function render(src, ctx) {
  return new Template(src).render(ctx);
}

// Expands the corpus: each conversation renders with add_generation_prompt
// true and false, and with enable_thinking absent, true and false.
function cases(corpus) {
  const out = [];
  for (const conv of corpus.conversations) {
    for (const agp of [false, true]) {
      for (const think of [undefined, true, false]) {
        const ctx = {
          messages: conv.messages,
          bos_token: corpus.bos_token,
          eos_token: corpus.eos_token,
          add_generation_prompt: agp,
        };
        if (conv.tools !== undefined) ctx.tools = conv.tools;
        if (think !== undefined) ctx.enable_thinking = think;
        Object.assign(ctx, conv.kwargs ?? {});
        const name = `${conv.name}__agp${agp ? 1 : 0}__think${think === undefined ? "u" : think ? 1 : 0}`;
        out.push([name, ctx]);
      }
    }
  }
  return out;
}

const args = process.argv.slice(2);
if (args[0] === "--batch") {
  const [, tdir, corpusPath, outDir] = args;
  const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
  const templates = fs.readdirSync(tdir).filter((f) => f.endsWith(".jinja")).sort();
  fs.mkdirSync(path.join(outDir, "ctx"), { recursive: true });
  const all = cases(corpus);
  for (const [name, ctx] of all) {
    fs.writeFileSync(path.join(outDir, "ctx", `${name}.json`), JSON.stringify(ctx));
  }
  for (const t of templates) {
    const src = fs.readFileSync(path.join(tdir, t), "utf8");
    const base = t.replace(/\.jinja$/, "");
    const dir = path.join(outDir, "exp", base);
    fs.mkdirSync(dir, { recursive: true });
    let tmpl = null;
    let parseErr = null;
    try {
      tmpl = new Template(src);
    } catch (e) {
      parseErr = String(e.message ?? e);
    }
    for (const [name, ctx] of all) {
      try {
        if (parseErr !== null) throw new Error(parseErr);
        fs.writeFileSync(path.join(dir, `${name}.txt`), tmpl.render(ctx));
      } catch (e) {
        fs.writeFileSync(path.join(dir, `${name}.err`), String(e.message ?? e));
      }
    }
  }
} else if (args[0] === "--cases") {
  const { cases: list } = JSON.parse(fs.readFileSync(args[1], "utf8"));
  let bad = 0;
  let checked = 0;
  for (const c of list) {
    if (c.extension) continue;
    checked++;
    let out;
    let err = null;
    try {
      out = render(c.template, c.vars ?? {});
    } catch (e) {
      err = String(e.message ?? e);
    }
    if ("expect" in c) {
      if (err !== null || out !== c.expect) {
        bad++;
        console.log(`case ${c.name}: reference gives ${JSON.stringify(err ?? out)}, the case expects ${JSON.stringify(c.expect)}`);
      }
    } else if (err === null) {
      bad++;
      console.log(`case ${c.name}: reference renders ${JSON.stringify(out)}, the case expects an error`);
    }
  }
  console.log(`unit cases: ${checked} checked against the reference, ${bad} disagree`);
  process.exit(bad === 0 ? 0 : 1);
} else if (args.length === 2) {
  const src = fs.readFileSync(args[0], "utf8");
  const ctx = JSON.parse(fs.readFileSync(args[1], "utf8"));
  try {
    process.stdout.write(render(src, ctx));
  } catch (e) {
    process.stderr.write(String(e.message ?? e) + "\n");
    process.exit(1);
  }
} else {
  process.stderr.write("usage: node render.mjs TEMPLATE.jinja CONTEXT.json | --batch TDIR CORPUS OUTDIR\n");
  process.exit(2);
}
