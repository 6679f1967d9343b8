#!/usr/bin/env python3
"""PyTorch reference point for Shardline's GPU throughput benchmark.

The setting of vLLM's offline throughput benchmark: dummy (random) weights of a
model shape (a folder holding only config.json, e.g. shared/models/shapes/
llama-3.1-8b), N prompts of random token ids x input_len, output_len tokens
each by ignore-EOS greedy decoding, total tokens/s = N*(in+out)/wall. vLLM
publishes about 12.5k tok/s on one H100 for llama-3.1-8b 1000 x (256 in / 256
out); this script is a second, simpler reference point on the same machine: a
plain PyTorch Llama / Qwen3 decoder (no transformers model classes) with a
static BF16 KV cache [layers, 2, batch, kv_heads, max_len, head_dim], prompts
run in static batches of --batch-size (one prefill forward over [B, in], then
out-1 decode forwards over [B, 1]; the prefill yields the first output token).
No paged attention and no continuous batching: what a plain PyTorch program
reaches, not an upper bound.

The same run measures HBM bandwidth (2 GiB device-to-device copy_, read +
written bytes, median of 10) and the BF16 matmul peak (8192^3, median of 10),
and compares the decode step with its HBM roofline: (weight bytes + KV bytes
read) / measured bandwidth. A table goes to stderr, one JSON line to stdout.

On the device machine, from the repository root:
    python3 bench/torch_reference.py --shape ../shared/models/shapes/llama-3.1-8b
    python3 bench/torch_reference.py --shape ../shared/models/shapes/llama-3.1-8b --cuda-graph
    python3 bench/torch_reference.py --check [--cuda-graph] [--compile]
--check verifies the script's own KV-cache logic on tiny 2-layer configs: the
logits of prefill + cached decode against one no-cache forward of the same
tokens (exit 1 if the max abs diff exceeds 1e-2 in bf16/f16, 1e-4 in f32).
Quick CPU smoke test: --device cpu --num-layers 1 --num-prompts 4 --batch-size 2
--input-len 8 --output-len 4.
"""
import argparse
import importlib
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_SDPA = getattr(F, "scaled_dot_product_attention", None)  # torch >= 2.0
_GQA_KW = _SDPA is not None and tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Cfg:
    """The config.json fields a Llama / Qwen3 decoder needs."""

    def __init__(self, d, name="model"):
        self.name, self.model_type = name, d.get("model_type", "llama")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {d['hidden_act']} not supported (silu only)")
        self.hidden, self.inter = d["hidden_size"], d["intermediate_size"]
        self.layers, self.heads = d["num_hidden_layers"], d["num_attention_heads"]
        self.kv_heads = d.get("num_key_value_heads") or self.heads
        self.head_dim = d.get("head_dim") or self.hidden // self.heads  # Qwen3 gives it explicitly
        self.vocab, self.eps = d["vocab_size"], d.get("rms_norm_eps", 1e-6)
        rp = d.get("rope_parameters") or {}  # transformers >= 5 spelling
        self.rope_theta = d.get("rope_theta", rp.get("rope_theta", 10000.0))
        self.rope_scaling = d.get("rope_scaling") or (rp if rp.get("rope_type", "default") != "default" else None)
        self.tie = bool(d.get("tie_word_embeddings", False))
        self.qk_norm = self.model_type.startswith("qwen3")  # per-head RMSNorm of q and k
        self.bias = bool(d.get("attention_bias", False))


def rope_tables(cfg, max_len, device):
    """cos, sin [max_len, head_dim] in float32 (HF rotate_half layout), llama3 scaling as in HF."""
    D = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    sc = cfg.rope_scaling
    kind = (sc or {}).get("rope_type", (sc or {}).get("type", "default"))
    if kind == "llama3":
        factor, lo, hi = sc["factor"], sc.get("low_freq_factor", 1.0), sc.get("high_freq_factor", 4.0)
        old = sc.get("original_max_position_embeddings", 8192)
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / inv
        scaled = torch.where(wl > lo_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        inv = torch.where((wl >= hi_wl) & (wl <= lo_wl), smoothed, scaled)
    elif kind != "default":
        raise ValueError(f"rope_type {kind} not supported (default, llama3)")
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1).to(device)
    return emb.cos(), emb.sin()


def rms_norm(x, w, eps):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rope(x, cos, sin):  # x [b, h, T, D]; cos, sin [T, D]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def naive_attention(q, k, v, mask=None, causal=False):
    """Float32 softmax attention: the --check reference, and the fallback for torch < 2.0."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:  # GQA: query head h reads kv head h // rep (HF repeat_kv)
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s + mask.float()
    if causal:
        tq, tk = s.shape[-2:]
        s = s.masked_fill(torch.ones(tq, tk, dtype=torch.bool, device=s.device).triu(tk - tq + 1), float("-inf"))
    return (s.softmax(-1) @ v.float()).to(q.dtype)


def attention(q, k, v, mask=None, causal=False):
    if _SDPA is None:
        return naive_attention(q, k, v, mask, causal)
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        if _GQA_KW:
            return _SDPA(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return _SDPA(q, k, v, attn_mask=mask, is_causal=causal)


class Model:
    """Llama / Qwen3 decoder with dummy weights and a static KV cache."""

    def __init__(self, cfg, dtype, device, max_batch, max_len, seed=0, init="bench"):
        self.cfg, self.dtype, self.device, self.max_len = cfg, dtype, device, max_len
        g = torch.Generator(device=device)
        g.manual_seed(seed)

        def rnd(*shape, std):
            try:
                t = torch.randn(shape, generator=g, device=device, dtype=dtype)
            except RuntimeError:  # no randn for this dtype on this device
                t = torch.randn(shape, generator=g, device=device).to(dtype)
            return t.mul_(std)

        # bench: N(0, 0.02) everywhere (speed does not depend on the values). check: fan-in scaled,
        # so attention is position-sensitive and a cache bug shows; logits kept ~0.1 for the tolerance.
        def std(fan_in):
            return 0.02 if init == "bench" else 1.0 / math.sqrt(fan_in)

        out_std = 0.02 if init == "bench" else 0.1 / math.sqrt(cfg.hidden)
        H, KV, D, E, I = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.hidden, cfg.inter
        ones = lambda n: torch.ones(n, dtype=dtype, device=device)  # noqa: E731
        self.embed = rnd(cfg.vocab, E, std=out_std)
        self.layers = []
        for _ in range(cfg.layers):
            L = {"ln1": ones(E), "ln2": ones(E),
                 "wqkv": rnd((H + 2 * KV) * D, E, std=std(E)),
                 "bqkv": rnd((H + 2 * KV) * D, std=std(E)) if cfg.bias else None,
                 "wo": rnd(E, H * D, std=std(H * D)),
                 "bo": rnd(E, std=std(H * D)) if cfg.bias else None,
                 "w13": rnd(2 * I, E, std=std(E)),  # gate_proj; up_proj
                 "w2": rnd(E, I, std=std(I))}
            if cfg.qk_norm:
                L["qn"], L["kn"] = ones(D), ones(D)
            self.layers.append(L)
        self.norm = ones(E)
        self.lm_head = self.embed if cfg.tie else rnd(cfg.vocab, E, std=out_std)
        self.kv = torch.zeros((cfg.layers, 2, max_batch, KV, max_len, D), dtype=dtype, device=device)
        cos, sin = rope_tables(cfg, max_len, device)
        self.cos, self.sin = cos.to(dtype), sin.to(dtype)
        self.positions = torch.arange(max_len, device=device)

    def tensors(self):
        ts = [t for L in self.layers for t in L.values() if t is not None]
        return ts + [self.norm, self.embed, self.cos, self.sin, self.positions, self.kv] + \
            ([] if self.cfg.tie else [self.lm_head])

    def weight_bytes_per_step(self):
        """Bytes of weights a forward reads (embedding rows gathered are negligible; a tied
        embedding is read whole as the lm_head)."""
        ts = [t for L in self.layers for t in L.values() if t is not None] + [self.norm, self.lm_head]
        return sum(t.numel() * t.element_size() for t in ts)

    def linear_params(self):
        return sum(L[k].numel() for L in self.layers for k in ("wqkv", "wo", "w13", "w2")) + self.lm_head.numel()

    def kv_bytes_per_token(self):
        c = self.cfg
        return c.layers * 2 * c.kv_heads * c.head_dim * self.kv.element_size()

    def _forward(self, tokens, cos, sin, attn):
        c = self.cfg
        b, T = tokens.shape
        H, KV, D = c.heads, c.kv_heads, c.head_dim
        h = F.embedding(tokens, self.embed)
        for i, L in enumerate(self.layers):
            x = rms_norm(h, L["ln1"], c.eps)
            q, k, v = F.linear(x, L["wqkv"], L["bqkv"]).split([H * D, KV * D, KV * D], dim=-1)
            q, k, v = q.view(b, T, H, D), k.view(b, T, KV, D), v.view(b, T, KV, D)
            if c.qk_norm:
                q, k = rms_norm(q, L["qn"], c.eps), rms_norm(k, L["kn"], c.eps)
            q, k = rope(q.transpose(1, 2), cos, sin), rope(k.transpose(1, 2), cos, sin)
            o = attn(i, q, k, v.transpose(1, 2))  # -> [b, T, H*D]
            h = h + F.linear(o, L["wo"], L["bo"])
            gate, up = F.linear(rms_norm(h, L["ln2"], c.eps), L["w13"]).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, L["w2"])
        return h

    def _logits(self, h):
        return F.linear(rms_norm(h, self.norm, self.cfg.eps), self.lm_head)

    def forward_full(self, tokens):
        """No-cache reference: logits [b, T, V] of every position (float32 naive attention)."""
        b, T = tokens.shape

        def attn(i, q, k, v):
            return naive_attention(q, k, v, causal=True).transpose(1, 2).reshape(b, T, -1)
        return self._logits(self._forward(tokens, self.cos[:T], self.sin[:T], attn))

    def prefill(self, tokens):
        """Fills cache positions [0, T) of batch rows [0, b); returns last-position logits [b, V]."""
        b, T = tokens.shape

        def attn(i, q, k, v):
            self.kv[i, 0, :b, :, :T] = k
            self.kv[i, 1, :b, :, :T] = v
            return attention(q, k, v, causal=True).transpose(1, 2).reshape(b, T, -1)
        return self._logits(self._forward(tokens, self.cos[:T], self.sin[:T], attn)[:, -1])

    def _decode_attn(self, b, write, span, mask):
        G = self.cfg.heads // self.cfg.kv_heads

        def attn(i, q, k, v):
            kc, vc = self.kv[i, 0, :b], self.kv[i, 1, :b]  # [b, KV, max_len, D]
            write(kc, k)
            write(vc, v)
            # GQA decode without repeat: the G query heads of a kv head are its "query rows".
            qg = q.reshape(b, self.cfg.kv_heads, G, self.cfg.head_dim)
            return attention(qg, kc[:, :, :span], vc[:, :, :span], mask=mask).reshape(b, 1, -1)
        return attn

    def decode(self, tokens, p):
        """Eager decode step at python position p: attention over the cache sliced to p+1."""
        b = tokens.shape[0]

        def write(cache, x):
            cache[:, :, p] = x[:, :, 0]
        attn = self._decode_attn(b, write, p + 1, None)
        return self._logits(self._forward(tokens, self.cos[p:p + 1], self.sin[p:p + 1], attn)[:, 0])

    def decode_static(self, tokens, pos):
        """Graph-safe decode step: position as a device tensor [1], attention over the whole
        max_len with an additive mask, so every shape is static. Returns (logits, next ids)."""
        b = tokens.shape[0]
        mask = torch.zeros(self.max_len, dtype=self.dtype, device=tokens.device)
        mask = mask.masked_fill(self.positions > pos, float("-inf")).view(1, 1, 1, -1)
        attn = self._decode_attn(b, lambda cache, x: cache.index_copy_(2, pos, x), self.max_len, mask)
        h = self._forward(tokens, self.cos.index_select(0, pos), self.sin.index_select(0, pos), attn)
        logits = self._logits(h[:, 0])
        return logits, logits.argmax(-1)


class Decoder:
    """One decode step in a mode: eager (cache sliced to p+1), static (eager, masked full-length
    attention), graph (static step captured per batch size with torch.cuda.graphs), compile
    (static step under torch.compile mode="reduce-overhead"). graph/compile fall back to eager
    with a message when they fail."""

    def __init__(self, model, mode):
        self.model, self.mode, self.fallback = model, mode, None
        self.bufs, self.graphs = {}, {}
        if mode == "compile":
            try:
                dynamo = importlib.import_module("torch._dynamo")
                for t in model.tensors():  # weights and cache: static inputs, no copy per replay
                    dynamo.mark_static_address(t)
                self.fn = torch.compile(model.decode_static, mode="reduce-overhead", dynamic=False)
            except Exception as e:  # noqa: BLE001
                self._fail(e)

    def _fail(self, e):
        log(f"[torch_reference] {self.mode} failed ({type(e).__name__}: {str(e)[:300]}); falling back to eager")
        self.fallback, self.mode = f"{self.mode}: {type(e).__name__}", "eager"

    def _buffers(self, b):
        if b not in self.bufs:
            dev = self.model.device
            self.bufs[b] = (torch.zeros(b, 1, dtype=torch.long, device=dev), torch.zeros(1, dtype=torch.long, device=dev))
        return self.bufs[b]

    def _capture(self, b, tok, pos):
        # Inputs hold the real step, so warm-up and capture write the same cache slot the replay writes.
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self.model.decode_static(tok, pos)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = self.model.decode_static(tok, pos)
        self.graphs[b] = (g, out)

    def __call__(self, tokens, p):
        if self.mode in ("graph", "compile"):
            try:
                b = tokens.shape[0]
                tok, pos = self._buffers(b)
                tok.copy_(tokens)
                pos.copy_(self.model.positions[p:p + 1])
                if self.mode == "compile":
                    if hasattr(torch, "compiler") and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
                        torch.compiler.cudagraph_mark_step_begin()
                    return self.fn(tok, pos)
                if b not in self.graphs:
                    self._capture(b, tok, pos)
                g, out = self.graphs[b]
                g.replay()
                return out
            except Exception as e:  # noqa: BLE001
                self._fail(e)
        if self.mode == "static":
            return self.model.decode_static(tokens, self.model.positions[p:p + 1])
        logits = self.model.decode(tokens, p)
        return logits, logits.argmax(-1)


class _CpuEvent:
    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def new_event(device):
    return torch.cuda.Event(enable_timing=True) if device.type == "cuda" else _CpuEvent()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def generate(model, dec, prompts, out_len, keep_logits=False):
    """Greedy, ignore-EOS. Returns (tokens [b, out_len], events [prefill start, prefill end,
    after each decode step], logits [b, out_len, V] or None)."""
    b, T = prompts.shape
    ev = [new_event(model.device) for _ in range(out_len + 1)]
    ev[0].record()
    logits = model.prefill(prompts)
    nxt = logits.argmax(-1)
    out = torch.empty(b, out_len, dtype=torch.long, device=prompts.device)
    out[:, 0] = nxt
    kept = [logits.clone()] if keep_logits else None
    ev[1].record()
    for i in range(1, out_len):
        logits, nxt = dec(nxt.view(b, 1), T + i - 1)
        out[:, i] = nxt
        if keep_logits:
            kept.append(logits.clone())
        ev[i + 1].record()
    return out, ev, (torch.stack(kept, 1) if keep_logits else None)


def median_ms(fn, device, iters=10, warmup=3):
    for _ in range(warmup):
        fn()
    sync(device)
    evs = [(new_event(device), new_event(device)) for _ in range(iters)]
    for e0, e1 in evs:
        e0.record()
        fn()
        e1.record()
    sync(device)
    return statistics.median(e0.elapsed_time(e1) for e0, e1 in evs)


def hw_probes(device):
    """(HBM GB/s by copy_, read + written; BF16 matmul TFLOP/s). Smaller sizes on CPU."""
    nbytes, n = (2 << 30, 8192) if device.type == "cuda" else (64 << 20, 512)
    src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    gbs = 2 * nbytes / (median_ms(lambda: dst.copy_(src), device) / 1e3) / 1e9
    del src, dst
    a = torch.randn(n, n, device=device).to(torch.bfloat16)
    bm = torch.randn(n, n, device=device).to(torch.bfloat16)
    c = torch.empty(n, n, dtype=torch.bfloat16, device=device)
    tflops = 2 * n ** 3 / (median_ms(lambda: torch.matmul(a, bm, out=c), device) / 1e3) / 1e12
    del a, bm, c
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return gbs, tflops


_TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512}
TINY = {
    "tiny-llama3": dict(_TINY, model_type="llama", rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # head_dim != hidden / heads and tied embeddings, as in Qwen3-0.6B
    "tiny-qwen3-tied": dict(_TINY, model_type="qwen3", rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                            head_dim=48),
}


def run_check(args, device):
    cfgs = [Cfg(d, n) for n, d in TINY.items()]
    modes = ["eager", "static"]
    for flag, mode in ((args.cuda_graph, "graph"), (args.compile, "compile")):
        if flag and device.type == "cuda":
            modes.append(mode)
        elif flag:
            log(f"[check] {mode} needs a CUDA device: skipped")
    B, T, OUT = 3, 5, 7
    ok = True
    for cfg in cfgs:
        for dtype in dict.fromkeys([torch.float32, DTYPES[args.dtype]]):
            tol = 1e-4 if dtype == torch.float32 else 1e-2
            model = Model(cfg, dtype, device, max_batch=B + 1, max_len=T + OUT, seed=0, init="check")
            g = torch.Generator(device=device)
            g.manual_seed(1)
            prompts = torch.randint(0, cfg.vocab, (B, T), generator=g, device=device)
            for mode in modes:
                model.kv.zero_()
                dec = Decoder(model, mode)
                toks, _, got = generate(model, dec, prompts, OUT, keep_logits=True)
                ref = model.forward_full(torch.cat([prompts, toks[:, :-1]], 1))[:, T - 1:]
                diff = (got.float() - ref.float()).abs().max().item()
                good = diff <= tol and dec.fallback is None
                ok &= good
                log(f"[check] {cfg.name:24s} {str(dtype)[6:]:9s} {mode:8s} max|diff| {diff:.3e} "
                    f"(tol {tol:g}, logits std {ref.float().std().item():.3f}) {'ok' if good else 'FAIL'}"
                    + (f" [fell back: {dec.fallback}]" if dec.fallback else ""))
    log("[check] " + ("all passed" if ok else "FAILED"))
    return 0 if ok else 1


def run_bench(args, device):
    dtype = DTYPES[args.dtype]
    with open(os.path.join(args.shape, "config.json")) as f:
        cfg = Cfg(json.load(f), os.path.basename(os.path.normpath(args.shape)))
    if args.num_layers:
        cfg.layers = args.num_layers
    N, IN, OUT = args.num_prompts, args.input_len, args.output_len
    B = min(args.batch_size, N)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    log(f"[torch_reference] {cfg.name} ({cfg.layers} layers, {args.dtype}) on {dev_name}, torch {torch.__version__}")
    hbm_gbs, tflops = hw_probes(device)
    model = Model(cfg, dtype, device, max_batch=B, max_len=IN + OUT, seed=0)
    mode = "compile" if args.compile else "graph" if args.cuda_graph else "eager"
    if args.compile and args.cuda_graph:
        log("[torch_reference] --compile already graphs the step (reduce-overhead): --cuda-graph ignored")
    if mode != "eager" and device.type != "cuda":
        log(f"[torch_reference] {mode} needs a CUDA device: running eager")
        mode = "eager"
    dec = Decoder(model, mode)
    g = torch.Generator(device=device)
    g.manual_seed(1)
    prompts = torch.randint(0, cfg.vocab, (N, IN), generator=g, device=device)
    sizes = [min(B, N - s) for s in range(0, N, B)]
    for b in sorted(set(sizes), reverse=True):  # also captures / compiles each batch size
        for _ in range(args.warmup):
            generate(model, dec, prompts[:b], min(OUT, 8))
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    runs, t0 = [], time.perf_counter()
    for j, b in enumerate(sizes):
        _, ev, _ = generate(model, dec, prompts[j * B:j * B + b], OUT)
        runs.append((b, ev))
    sync(device)
    wall = time.perf_counter() - t0

    prefill_s = sum(ev[0].elapsed_time(ev[1]) for _, ev in runs) / 1e3
    decode_s = sum(ev[1].elapsed_time(ev[-1]) for _, ev in runs) / 1e3
    steps = {}
    for b, ev in runs:
        steps.setdefault(b, []).extend(ev[i].elapsed_time(ev[i + 1]) for i in range(1, OUT))
    wbytes, kvtok = model.weight_bytes_per_step(), model.kv_bytes_per_token()
    ctx = [p + 1 for p in range(IN, IN + OUT - 1)]  # cache positions a decode step reads (ideal)

    def roofline_ms(b):
        return statistics.mean((wbytes + b * c * kvtok) / (hbm_gbs * 1e9) * 1e3 for c in ctx) if ctx else 0.0
    by_b = {b: {"decode_step_ms": statistics.median(v) if v else 0.0, "roofline_step_ms": roofline_ms(b)} for b, v in steps.items()}
    step_ms = by_b[B]["decode_step_ms"] if B in by_b else 0.0
    roof_ms = roofline_ms(B)
    prefill_flops = 2 * model.linear_params() * N * IN  # linear layers only
    res = {
        "bench": "torch_reference", "model": cfg.name, "device": dev_name, "torch": torch.__version__,
        "dtype": args.dtype, "num_layers": cfg.layers, "batch_size": B, "num_prompts": N,
        "input_len": IN, "output_len": OUT, "elapsed_s": wall,
        "total_tok_s": N * (IN + OUT) / wall, "output_tok_s": N * OUT / wall,
        "prefill_tok_s": N * IN / prefill_s, "decode_tok_s": N * (OUT - 1) / decode_s if decode_s else 0.0,
        "prefill_s": prefill_s, "decode_s": decode_s,
        "decode_step_ms": step_ms, "roofline_step_ms": roof_ms,
        "roofline_ratio": step_ms / roof_ms if roof_ms else 0.0,
        "decode_by_batch": {str(b): v for b, v in by_b.items()},
        "hbm_gbs": hbm_gbs, "bf16_tflops": tflops,
        "prefill_linear_mfu": prefill_flops / prefill_s / (tflops * 1e12),
        "weight_bytes": wbytes, "kv_cache_bytes": model.kv.numel() * model.kv.element_size(),
        "peak_mem_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0,
        "mode": dec.mode, "cuda_graph": dec.mode == "graph", "compile": dec.mode == "compile",
        "cuda_graph_requested": args.cuda_graph, "compile_requested": args.compile,
        "fallback": dec.fallback, "attn_over_full_cache": dec.mode != "eager",
    }
    log(f"  HBM copy        {hbm_gbs:9.0f} GB/s    BF16 matmul {tflops:7.1f} TFLOP/s")
    log(f"  workload        {N} prompts x ({IN} in + {OUT} out), batch {B}, mode {dec.mode}"
        + (f" (fell back: {dec.fallback})" if dec.fallback else ""))
    log(f"  total           {res['total_tok_s']:9.0f} tok/s   ({wall:.2f} s wall, output {res['output_tok_s']:.0f} tok/s)")
    log(f"  prefill         {res['prefill_tok_s']:9.0f} tok/s   ({prefill_s:.2f} s, linear MFU {res['prefill_linear_mfu']:.1%})")
    log(f"  decode          {res['decode_tok_s']:9.0f} tok/s   ({decode_s:.2f} s)")
    for b, v in sorted(by_b.items(), reverse=True):
        r = v["roofline_step_ms"]
        log(f"  decode step b={b:<4d} {v['decode_step_ms']:8.2f} ms  (HBM roofline {r:.2f} ms, "
            f"{v['decode_step_ms'] / r if r else 0:.2f}x)")
    log(f"  weights {wbytes / 2**30:.2f} GiB, KV cache {res['kv_cache_bytes'] / 2**30:.2f} GiB, "
        f"peak {res['peak_mem_bytes'] / 2**30:.2f} GiB")
    print(json.dumps(res), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", help="model shape folder holding config.json")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    ap.add_argument("--cuda-graph", action="store_true", help="capture the decode step with torch.cuda.graphs")
    ap.add_argument("--compile", action="store_true", help='torch.compile(mode="reduce-overhead") the decode step')
    ap.add_argument("--num-layers", type=int, default=0, help="override num_hidden_layers (quick tests)")
    ap.add_argument("--warmup", type=int, default=1, help="short warm-up generations per batch size")
    ap.add_argument("--check", action="store_true", help="verify the KV-cache logic on tiny configs and exit")
    args = ap.parse_args()
    if not args.check and not args.shape:
        ap.error("--shape is required (or --check)")
    if min(args.num_prompts, args.input_len, args.output_len, args.batch_size) < 1:
        ap.error("sizes must be positive")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        log("[torch_reference] CUDA is not available (use --device cpu for a smoke test)")
        return 2
    with torch.no_grad():
        return run_check(args, device) if args.check else run_bench(args, device)


if __name__ == "__main__":
    sys.exit(main())
