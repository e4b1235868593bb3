#!/bin/bash
# GPU checks (needs a CUDA device): kernel-check, then logits parity of the
# CUDA backend on the fixture models.
#   BF16 files: against the transformers float32 logits (ref-logits-N.f32),
#     median and worst row relative L2 over all positions of the 3 prompts,
#     bound 5e-3 each (rows above it are listed with the reference top-2 gap);
#     greedy continuation of prompt 0 against the reference's 24 ids.
#   Quantized files: GPU against the CPU backend on the same file (prompt 2),
#     in the default precision (float16 prompt GEMMs and K/V cache: bound
#     5e-3) and in float32 (MEMRA_CUDA_GEMM=f32 --kv-dtype f32: median 1e-3,
#     worst 1e-2), and both against the reference for information.  On the
#     mixture models a row over the bound is listed with the layers whose
#     routing differs between the two (run-gen --router-out), and excused
#     when the CPU's k-th and (k+1)-th router logits there differ by less
#     than the two backends' router logits do (a near-tie).
#   Models: qwen3, qwen3moe and the hybrids qwen35, qwen35moe.
#   Full widths: the fixtures' matrices are too small for several decode
#     kernels (the 22-bit one takes 12,288 rows and more: the output heads,
#     the 8B's MLP; the int8 tensor-core ones the dense products), so
#     synthetic files of the 30B-A3B, the 35B-A3B and the 8B at their full
#     widths with only a few layers (memra-synth --layers) run on both
#     backends: 4 prompt ids, then 12 ids fed as decode steps (run-gen
#     --feed), the GPU's rows against the CPU's, the quantized files' bounds
#     and, on the mixtures, their near-tie rule (routers of the prompt and
#     the fed rows by run-gen --router-out).
#   Speculation (hybrids): run-spec --backend cuda for K = 1..8 prints the
#     ids that run-gen --backend cuda prints (greedy with MTP drafts equals
#     greedy without), on prompts 0 and 2 of the BF16 files and on a
#     quantized file.
# Usage: scripts/gpu-test.sh BUILD FIXTURES      exit 0 = all passed
#   GPU_TEST_MODELS="qwen35 qwen35moe" limits the fixture models checked;
#   GPU_TEST_KV=f32 (or bf16) runs the CUDA side's default-precision lines
#   with that K/V cache type instead of the backend's float16 (the CPU side
#   keeps float32; the float32 lines keep float32);
#   GPU_TEST_KERNELS=0 skips kernel-check (e.g. to compare MEMRA_CUDA_GEMM modes);
#   GPU_TEST_WIDE=0 skips the full-width files (they take ~5 GB of disk in TMPDIR).
set -u
BUILD=${1:-build}
FIXTURES=${2:-../shared/fixtures}
BIN=$BUILD/bin
fail=0

if [ "${GPU_TEST_KERNELS:-1}" != 0 ]; then
    echo "== kernel-check"
    "$BIN/kernel-check" > "$BUILD/kernel-check.log" 2>&1
    rc=$?
    grep -v " ok$" "$BUILD/kernel-check.log" | tail -40
    if [ $rc -eq 77 ]; then
        echo "no CUDA device: GPU tests skipped"
        exit 77
    fi
    [ $rc -eq 0 ] || fail=1
    # the tensor-core expert products (the default for Q4_K and Q6_K):
    # their own part, the whole run above keeps the dp4a kernel in view
    echo "== kernel-check xmm"
    "$BIN/kernel-check" "$(date +%s)" xmm > "$BUILD/kernel-check-xmm.log" 2>&1 || fail=1
    grep -v " ok$" "$BUILD/kernel-check-xmm.log" | tail -20
    # and with several row tiles a warp (MEMRA_CUDA_XMM_TPW)
    echo "== kernel-check xmmt"
    "$BIN/kernel-check" "$(date +%s)" xmmt > "$BUILD/kernel-check-xmmt.log" 2>&1 || fail=1
    grep -v " ok$" "$BUILD/kernel-check-xmmt.log" | tail -20
    # the prompt products of IQ4_XS on the int8 tensor cores (the default)
    echo "== kernel-check xmp"
    "$BIN/kernel-check" "$(date +%s)" xmp > "$BUILD/kernel-check-xmp.log" 2>&1 || fail=1
    grep -v " ok$" "$BUILD/kernel-check-xmp.log" | tail -20
    # the prompt expert products of Q4_K, Q6_K and IQ4_XS on the float16
    # tensor cores, weights decoded in registers (the default)
    echo "== kernel-check xmh"
    "$BIN/kernel-check" "$(date +%s)" xmh > "$BUILD/kernel-check-xmh.log" 2>&1 || fail=1
    grep -v " ok$" "$BUILD/kernel-check-xmh.log" | tail -20
    # the decode batches of dense Q4_K products on the int8 tensor cores (the default)
    echo "== kernel-check xmd"
    "$BIN/kernel-check" "$(date +%s)" xmd > "$BUILD/kernel-check-xmd.log" 2>&1 || fail=1
    grep -v " ok$" "$BUILD/kernel-check-xmd.log" | tail -20
    # decode attention on the tensor cores (MEMRA_CUDA_ATTN_DEC_TC)
    echo "== kernel-check dectc"
    "$BIN/kernel-check" "$(date +%s)" dectc > "$BUILD/kernel-check-dectc.log" 2>&1 || fail=1
    grep -v " ok$" "$BUILD/kernel-check-dectc.log" | tail -20
fi

echo "== fixture parity (run-gen --backend cuda) and speculation (run-spec --backend cuda)"
python3 - "$BIN" "$FIXTURES" <<'EOF' || fail=1
import json, math, os, struct, subprocess, sys, tempfile

BIN, FIX = sys.argv[1], sys.argv[2]
BOUND = 5e-3
KV = ["--kv-dtype", os.environ["GPU_TEST_KV"]] if os.environ.get("GPU_TEST_KV") else []
tmp = tempfile.mkdtemp()

def run(model, toks, backend, out=None, n=None, extra=(), gemm=None, routers=None, feed=None):
    cmd = [os.path.join(BIN, "run-gen"), model, "--tokens", ",".join(map(str, toks)), "--backend", backend]
    if feed: cmd += ["--feed", ",".join(map(str, feed))]
    if routers: cmd += ["--router-out", routers]
    # the float32 lines run the float32 pipeline: GEMMs and K/V cache
    if backend == "cuda": cmd += ["--kv-dtype", "f32"] if gemm == "f32" else KV
    cmd += list(extra)
    if out: cmd += ["--logits-out", out]
    if n is not None: cmd += ["-n", str(n)]
    env = dict(os.environ)
    if gemm: env["MEMRA_CUDA_GEMM"] = gemm
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode:
        raise RuntimeError("%s: %s" % (" ".join(cmd[:2] + cmd[4:]), p.stderr.strip()))
    return p.stdout

def load(path, vocab):
    raw = open(path, "rb").read()
    v = struct.unpack("<%df" % (len(raw) // 4), raw)
    return [v[i:i + vocab] for i in range(0, len(v), vocab)]

def rel(a, b):
    num = den = 0.0
    for x, y in zip(a, b):
        if not math.isfinite(x): return float("inf")
        num += (x - y) ** 2; den += y * y
    return math.sqrt(num / den) if den else math.sqrt(num)

def argmax(r): return max(range(len(r)), key=lambda i: (r[i], -i))
# the gap between a row's k-th and (k+1)-th largest values
def kgap(r, k):
    s = sorted(r, reverse=True); return s[k - 1] - s[k]
# router dumps as [layers][rows][experts]: run-gen writes the prompt's
# [layers][rows][experts], then (--feed) each fed id's [layers][1][experts]
def load_routers(path, rows, experts, fed=0):
    v = load(path, experts)
    layers = len(v) // (rows + fed)
    out = [v[l * rows:(l + 1) * rows] for l in range(layers)]
    for i in range(fed):
        for l in range(layers): out[l].append(v[layers * (rows + i) + l])
    return out
def topk(r, k): return set(sorted(range(len(r)), key=lambda i: (-r[i], i))[:k])

# Rows of e over wb: those whose routing differs from the CPU's at some layer
# where the CPU's k-th and (k+1)-th logits differ by less than the two
# backends' largest router logit difference (near-ties: excused), and the rest.
def near_ties(e, wb, rg, rc, k):
    excused, notes = set(), []
    for t, x in enumerate(e):
        if x <= wb: continue
        why = []
        for l in range(len(rc)):
            a, b = rg[l][t], rc[l][t]
            if topk(a, k) == topk(b, k): continue
            gap, d = kgap(b, k), max(abs(p - q) for p, q in zip(a, b))
            why.append("layer %d: routing differs, CPU gap %.3g, router difference %.3g" % (l, gap, d))
            if gap < d: excused.add(t)
        notes.append("    row %d: rel L2 %.2e%s%s" % (t, x, " (near-tie, excused)" if t in excused else "",
                     "".join("\n      " + w for w in why) if why else "; routing the same at every layer"))
    return excused, notes

def med(v):
    v = sorted(v); n = len(v); return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])

ok = True
print("%-9s %-8s %-10s %10s %10s %8s  %s" % ("model", "file", "vs", "median", "worst", "argmax", "result"))
MODELS = os.environ.get("GPU_TEST_MODELS", "qwen3 qwen3moe qwen35 qwen35moe").split()
for name in MODELS:
    d = os.path.join(FIX, "models", name)
    ref = json.load(open(os.path.join(d, "reference.json")))
    vocab = ref["config"]["vocab_size"]
    prompts = ref["prompts"]
    # BF16 against transformers
    errs, agree, rows, flagged = [], 0, 0, []
    for i, pr in enumerate(prompts):
        out = os.path.join(tmp, "%s-bf16-%d.f32" % (name, i))
        run(os.path.join(d, "model-BF16.gguf"), pr, "cuda", out)
        got, want = load(out, vocab), load(os.path.join(d, "ref-logits-%d.f32" % i), vocab)
        for t, (g, w) in enumerate(zip(got, want)):
            e = rel(g, w); errs.append(e); rows += 1
            agree += argmax(g) == argmax(w)
            if e > BOUND: flagged.append((i, t, e, kgap(w, 1)))
    m, worst = med(errs), max(errs)
    res = m <= BOUND and worst <= BOUND
    print("%-9s %-8s %-10s %10.2e %10.2e %8.3f  %s" % (name, "BF16", "reference", m, worst, agree / rows, "ok" if res else "FAIL"))
    for (i, t, e, gap) in flagged:
        print("    row prompt %d pos %d: rel L2 %.2e, reference top-2 gap %.3g" % (i, t, e, gap))
    ok &= res
    greedy = list(map(int, run(os.path.join(d, "model-BF16.gguf"), prompts[0], "cuda", n=24).split()))
    want = ref["greedy_continuation_of_prompt0"]
    first = next((k for k in range(24) if greedy[k] != want[k]), None)
    print("%-9s %-8s %-10s greedy continuation of prompt 0: %s" % (name, "BF16", "reference",
          "identical (24 ids)" if first is None else "first differs at step %d" % first))
    ok &= first is None
    # quantized: GPU against the CPU backend on the same file, in the
    # production precision (float16 prompt GEMMs and K/V: the issue's 5e-3
    # rule) and in float32 (MEMRA_CUDA_GEMM=f32 --kv-dtype f32: median 1e-3,
    # worst 1e-2)
    pr = prompts[2]
    want = load(os.path.join(d, "ref-logits-2.f32"), vocab)
    cfg = ref["config"]
    experts, kx = cfg.get("num_experts", cfg.get("num_local_experts", 0)), cfg.get("num_experts_per_tok", 0)
    for q in ("Q8_0", "Q4_K_M", "IQ4_XS", "Q4_0"):
        f = os.path.join(d, "model-%s.gguf" % q)
        if not os.path.exists(f): continue
        og, oc, of = os.path.join(tmp, "g.f32"), os.path.join(tmp, "c.f32"), os.path.join(tmp, "f.f32")
        rt = {b: os.path.join(tmp, "r%s.f32" % b) if experts else None for b in ("g", "c", "f")}
        run(f, pr, "cuda", og, routers=rt["g"]); run(f, pr, "cpu", oc, routers=rt["c"])
        run(f, pr, "cuda", of, gemm="f32", routers=rt["f"])
        g, c = load(og, vocab), load(oc, vocab)
        for label, gg, mb, wb, rk in (("cpu", g, BOUND, BOUND, "g"), ("cpu f32", load(of, vocab), 1e-3, 1e-2, "f")):
            e = [rel(a, b) for a, b in zip(gg, c)]
            ag = sum(argmax(a) == argmax(b) for a, b in zip(gg, c)) / len(gg)
            excused, notes = set(), []
            if experts and max(e) > wb:
                excused, notes = near_ties(e, wb, load_routers(rt[rk], len(c), experts),
                                           load_routers(rt["c"], len(c), experts), kx)
            rest = [x for t, x in enumerate(e) if t not in excused]
            res = med(e) <= mb and (not rest or max(rest) <= wb)
            print("%-9s %-8s %-10s %10.2e %10.2e %8.3f  %s" % (name, q, label, med(e), max(e), ag,
                  ("ok" if res else "FAIL") + (" (%d near-tie rows excused)" % len(excused) if excused else "")))
            for n_ in notes: print(n_)
            ok &= res
        er = [rel(a, b) for a, b in zip(g, want)]
        ec = [rel(a, b) for a, b in zip(c, want)]
        print("%-9s %-8s %-10s %10.2e %10.2e          (info; cpu: median %.2e worst %.2e)" % (
            name, q, "reference", med(er), max(er), med(ec), max(ec)))

# Full widths: (preset, layers kept, experts, experts a token uses).  A
# hybrid keeps whole groups of 3 delta-net layers and a full-attention one.
# The mixtures' rows over the bound get the fixtures' near-tie rule.
WIDE = [("qwen3-30b-a3b-q4km", 4, 128, 8), ("qwen3.6-35b-a3b-iq4xs", 4, 256, 8), ("qwen3-8b-q4km", 2, 0, 0)]
if os.environ.get("GPU_TEST_WIDE", "1") != "0":
    P, F = [11, 22, 33, 44], [55, 66, 77, 88, 99, 111, 122, 133, 144, 155, 166, 177]
    for preset, layers, experts, kx in WIDE:
        f = os.path.join(tmp, preset + ".gguf")
        p = subprocess.run([os.path.join(BIN, "memra-synth"), preset, f, "--layers", str(layers)],
                           capture_output=True, text=True)
        if p.returncode:
            print("%-22s memra-synth: FAIL (%s)" % (preset, p.stderr.strip())); ok = False; continue
        oc, og, of = (os.path.join(tmp, "w%s.f32" % b) for b in ("c", "g", "f"))
        rt = {b: os.path.join(tmp, "wr%s.f32" % b) if experts else None for b in ("c", "g", "f")}
        run(f, P, "cpu", oc, feed=F, routers=rt["c"]); run(f, P, "cuda", og, feed=F, routers=rt["g"])
        run(f, P, "cuda", of, gemm="f32", feed=F, routers=rt["f"])
        n = len(P) + len(F)
        vocab = os.path.getsize(oc) // (4 * n)  # the preset's, from its rows
        c = load(oc, vocab)
        R = {b: load_routers(rt[b], len(P), experts, len(F)) for b in rt} if experts else None
        for label, gg, mb, wb, rk in (("cpu", load(og, vocab), BOUND, BOUND, "g"),
                                      ("cpu f32", load(of, vocab), 1e-3, 1e-2, "f")):
            for part, rows in (("prompt", range(len(P))), ("fed", range(len(P), n))):
                e = [rel(gg[t], c[t]) for t in rows]
                ag = sum(argmax(gg[t]) == argmax(c[t]) for t in rows) / len(e)
                excused, notes = set(), []
                if experts and max(e) > wb: # near_ties numbers the part's rows from 0
                    excused, notes = near_ties(e, wb, [l[rows.start:rows.stop] for l in R[rk]],
                                               [l[rows.start:rows.stop] for l in R["c"]], kx)
                rest = [x for t, x in enumerate(e) if t not in excused]
                res = med(e) <= mb and (not rest or max(rest) <= wb)
                print("%-22s %-6s %-10s %10.2e %10.2e %8.3f  %s" % (preset, part, label, med(e), max(e), ag,
                      ("ok" if res else "FAIL") + (" (%d near-tie rows excused)" % len(excused) if excused else "")))
                for n_ in notes: print(n_)
                ok &= res
        os.remove(f)

# MTP speculation: token for token what plain greedy gives, every K
def spec(model, toks, k, n):
    cmd = [os.path.join(BIN, "run-spec"), model, "--tokens", ",".join(map(str, toks)), "-n", str(n),
           "--k", str(k), "--backend", "cuda"] + KV
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError("%s: %s" % (" ".join(cmd[:2] + cmd[4:]), p.stderr.strip()))
    lines = p.stdout.strip().split("\n")
    return lines[0], lines[-1].split()

N_SPEC = 24
for name in [m for m in MODELS if m in ("qwen35", "qwen35moe")]:
    d = os.path.join(FIX, "models", name)
    ref = json.load(open(os.path.join(d, "reference.json")))
    prompts = ref["prompts"]
    for q, pi in (("BF16", 0), ("BF16", 2), ("Q4_K_M", 0)):
        f = os.path.join(d, "model-%s.gguf" % q)
        if not os.path.exists(f): continue
        # run-spec does not stop at end-of-generation ids
        want = run(f, prompts[pi], "cuda", n=N_SPEC, extra=["--ignore-eos"]).split()
        for k in range(1, 9):
            try:
                stats, got = spec(f, prompts[pi], k, N_SPEC)
            except RuntimeError as e:
                print("%-9s %-8s run-spec prompt %d k=%d: FAIL (%s)" % (name, q, pi, k, e))
                ok = False
                continue
            res = got == want
            first = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), None)
            print("%-9s %-8s run-spec prompt %d k=%d: %s  [%s]" % (name, q, pi, k,
                  "ok (= run-gen, %d ids)" % len(want) if res else
                  "FAIL (first differs at %s)" % (first if first is not None else "length"), stats))
            ok &= res
sys.exit(0 if ok else 1)
EOF

if [ $fail -eq 0 ]; then echo "gpu-test: ALL PASSED"; else echo "gpu-test: FAILED"; fi
exit $fail
