#!/usr/bin/env python3
"""The oracle of tests/model/hf_oracle_golden_test.cpp: Hugging Face
transformers + torch (CPU, eager attention) as the numerics reference for
Shardline's three architectures, the way vLLM's model tests use HF.

Usage: hf_oracle.py OUT_DIR [CASE ...]   (no CASE: all of them)

For each case (a Llama with untied embeddings; a Llama with tied embeddings
and llama3 rope scaling; a Qwen2 with q/k/v bias; a Qwen3 with per-head q/k
RMSNorm; all GQA: 8 query heads over 2 KV heads, head_dim 32) it builds a
small random model with transformers itself (`from_config`, seeded), and
saves it with `save_pretrained` (safetensors) twice:

  OUT_DIR/<case>/f32   the float32 model
  OUT_DIR/<case>/bf16  the same model cast to bfloat16 (dtype "bfloat16")

and once as GGUF (`save_gguf`: F32 tensors under llama.cpp's names and keys,
llama's q / k rows permuted and llama3 scaling as a `rope_freqs.weight`
tensor, as llama.cpp's converter writes them):

  OUT_DIR/<case>/gguf/model.gguf

then writes three references, each the prompt logits of 8 seeded random
prompts (5..40 tokens; every position) and their greedy continuations of 32
tokens (`generate(do_sample=False, max_new_tokens=32)`, no EOS so all 32 are
generated), with the top-5 logits of every generated step:

  f32         the float32 model in float32.
  gguf        the same reference, for the GGUF file of the same weights.
  bf16_f32    the bf16 checkpoint upcast to float32 and computed in float32:
              what Shardline computes with `--dtype f32` over a BF16 file
              (the loader widens BF16 to F32 exactly, all compute is F32).
  bf16_bf16   the same upcast model with every nn.Linear's input rounded to
              bfloat16 (round to nearest even) by a forward pre-hook: the
              definition of Shardline's BF16 compute (`--dtype bf16`,
              kernels/cpu/linear.hpp): each row of x is rounded to BF16 before
              every linear layer (q/k/v, o_proj, gate/up, down_proj and
              lm_head) and multiplied by the BF16 weights with F32
              accumulation; embeddings, RMSNorm, RoPE, attention, softmax,
              SiLU and the residual stream stay F32, as here.

Files, per case and reference (REF = f32 | bf16_f32 | bf16_bf16; gguf reuses f32's files):
  OUT_DIR/<case>/REF.prompt_logits.f32   raw little-endian float32, the
      prompts' logits one after the other, each [len, vocab] row-major.
  OUT_DIR/manifest.json  {"vocab_size", "max_new_tokens", "prompts": [[ids]],
      "cases": [{"name", "architecture", "tie_word_embeddings", "rope_theta",
      "rope_scaling", "refs": {REF: {"model": "f32"|"bf16",
      "prompt_logits": file, "generated": [[32 ids]],
      "top5": [[[[id, logit] x5] x32] per prompt], "min_top2_gap": float}}}]}

Weights: HF's own init (normal, std initializer_range) with a larger
initializer_range than the default 0.02, so logits spread over several
units and a greedy step is rarely a near-tie; HF initialises RMSNorm weights
to 1 and biases to 0, which would leave the norms and Qwen2's bias
untested, so those are redrawn (seeded) before saving.

Tolerances (in the C++ test, with the measurements behind them): f32 and
bf16_f32 within 1e-4 of Shardline's F32 compute, greedy ids identical;
bf16_bf16 within max 0.1 / mean 0.008, greedy teacher-forced, because the
BF16-rounded definition itself moves by ~0.05 between float32 and float64
evaluation (a value near a BF16 rounding boundary rounds either way).
One thread: see main().
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

VOCAB = 4096
NUM_PROMPTS = 8
MAX_NEW_TOKENS = 32
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}


def common(**kw):
    c = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
             vocab_size=VOCAB, rms_norm_eps=1e-6, initializer_range=0.1,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
    c.update(kw)
    return c


CASES = [
    # name, config class, config fields
    ("llama", LlamaConfig, common(intermediate_size=688, tie_word_embeddings=False, rope_theta=50000.0,
                                  max_position_embeddings=512)),
    ("llama_tied_llama3", LlamaConfig, common(intermediate_size=688, tie_word_embeddings=True, rope_theta=500000.0,
                                              rope_scaling=dict(LLAMA3_SCALING), max_position_embeddings=1024)),
    ("qwen2", Qwen2Config, common(intermediate_size=512, tie_word_embeddings=True, rope_theta=1000000.0,
                                  max_position_embeddings=512, use_sliding_window=False)),
    ("qwen3", Qwen3Config, common(intermediate_size=512, tie_word_embeddings=False, rope_theta=1000000.0,
                                  max_position_embeddings=512, use_sliding_window=False)),
]


def permute_for_gguf(w, n_head):
    """llama.cpp's converter reorders a llama q / k projection's rows within
    each head from rotate-half pairs (i, i + d/2) to interleaved (2i, 2i+1)
    for GGML's RoPE (the format's convention; Shardline's loader undoes it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(theta, head_dim, scaling):
    """The [head_dim / 2] divisors llama.cpp stores as `rope_freqs.weight` for
    llama3 scaling: 1 for short wavelengths, `factor` for long ones, and the
    smooth blend between (Meta's apply_scaling written as divisors)."""
    import math
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def save_gguf(model, fields, path):
    """The float32 model as a GGUF file (F32 tensors, llama.cpp's names and
    keys), written with the gguf package: what llama.cpp's converter makes of
    it, so Shardline's GGUF loader can be held to the same logits."""
    import gguf
    arch = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
            "Qwen3ForCausalLM": "qwen3"}[model.config.architectures[0]]
    heads, kv_heads = fields["num_attention_heads"], fields["num_key_value_heads"]
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(fields["max_position_embeddings"])
    w.add_embedding_length(fields["hidden_size"])
    w.add_block_count(fields["num_hidden_layers"])
    w.add_feed_forward_length(fields["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(fields["head_dim"])
    w.add_value_length(fields["head_dim"])
    w.add_rope_dimension_count(fields["head_dim"])
    w.add_rope_freq_base(fields["rope_theta"])
    w.add_layer_norm_rms_eps(fields["rms_norm_eps"])
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for name, t in model.state_dict().items():
        t = t.detach().to(torch.float32).clone()
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            if fields["tie_word_embeddings"]:
                continue
            out = "output.weight"
        else:
            parts = name.split(".")  # model.layers.N.<module>.<param>
            module, param = ".".join(parts[3:-1]), parts[-1]
            out = "blk.%s.%s.%s" % (parts[2], names[module], param)
            if arch == "llama" and module == "self_attn.q_proj":
                t = permute_for_gguf(t, heads)
            elif arch == "llama" and module == "self_attn.k_proj":
                t = permute_for_gguf(t, kv_heads)
        w.add_tensor(out, t.numpy())
    if fields.get("rope_scaling"):
        w.add_tensor("rope_freqs.weight",
                     llama3_rope_freqs(fields["rope_theta"], fields["head_dim"], fields["rope_scaling"]).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_config(cls, fields):
    cfg = cls(**fields)
    # transformers >= 5 keeps rope_theta / rope_scaling in rope_parameters; make
    # sure the fields really arrived there whatever spelling this version takes.
    rp = getattr(cfg, "rope_parameters", None) or {}
    theta = rp.get("rope_theta", getattr(cfg, "rope_theta", None))
    assert theta == fields["rope_theta"], (rp, theta)
    if "rope_scaling" in fields:
        scaling = rp if rp.get("rope_type") == "llama3" else getattr(cfg, "rope_scaling", None)
        assert scaling and scaling.get("rope_type") == "llama3", (rp, getattr(cfg, "rope_scaling", None))
    return cfg


def redraw_norms_and_biases(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # input/post-attention/final RMSNorm, Qwen3 q_norm/k_norm
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)  # U(0.5, 1.5)
            elif name.endswith(".bias"):  # Qwen2 q/k/v
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def round_linear_inputs_to_bf16(model):
    """Shardline's BF16 compute: x rounded to BF16 before every linear layer."""
    def hook(_module, args):
        return (args[0].to(torch.bfloat16).to(torch.float32),) + tuple(args[1:])

    n = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_pre_hook(hook)
            n += 1
    return n


def reference(model, prompts, out_path):
    """Writes the prompts' logits to out_path; returns generated ids, top-5 and the smallest top-2 gap."""
    generated, top5, min_gap = [], [], float("inf")
    with open(out_path, "wb") as f, torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids], dtype=torch.long)
            logits = model(input_ids=x).logits[0].to(torch.float32).contiguous()
            assert logits.shape == (len(ids), VOCAB), logits.shape
            f.write(logits.numpy().astype("<f4").tobytes())
            g = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                               max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS,
                               eos_token_id=None, pad_token_id=0, use_cache=True,
                               return_dict_in_generate=True, output_logits=True)
            new = g.sequences[0, len(ids):].tolist()
            assert len(new) == MAX_NEW_TOKENS and len(g.logits) == MAX_NEW_TOKENS, (len(new), len(g.logits))
            steps = []
            for s, step_logits in enumerate(g.logits):
                v, i = torch.topk(step_logits[0].to(torch.float32), 5)
                assert i[0].item() == new[s], "generate's id is not the argmax of its logits"
                min_gap = min(min_gap, (v[0] - v[1]).item())
                steps.append([[int(a), float(b)] for a, b in zip(i.tolist(), v.tolist())])
            generated.append(new)
            top5.append(steps)
    return generated, top5, min_gap


def main():
    out_dir, only = sys.argv[1], set(sys.argv[2:])
    unknown = only - {c[0] for c in CASES}
    if unknown:
        sys.exit(f"unknown case(s) {sorted(unknown)}; the cases are {[c[0] for c in CASES]}")
    # One thread: ctest runs other tests beside this one, and torch's thread
    # pool on a loaded machine runs ~70x slower with 2 threads than with 1.
    torch.set_num_threads(1)
    torch.manual_seed(1234)
    g = torch.Generator().manual_seed(4321)
    lengths = [5, 40] + torch.randint(6, 40, (NUM_PROMPTS - 2,), generator=g).tolist()
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]

    manifest = {"vocab_size": VOCAB, "max_new_tokens": MAX_NEW_TOKENS, "prompts": prompts, "cases": []}
    for ci, (name, cls, fields) in enumerate(CASES):
        if only and name not in only:
            continue
        case_dir = os.path.join(out_dir, name)
        cfg = make_config(cls, fields)
        torch.manual_seed(100 + ci)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()
        redraw_norms_and_biases(model, 200 + ci)
        model.save_pretrained(os.path.join(case_dir, "f32"))
        os.makedirs(os.path.join(case_dir, "gguf"), exist_ok=True)
        save_gguf(model, fields, os.path.join(case_dir, "gguf", "model.gguf"))
        model.to(torch.bfloat16).save_pretrained(os.path.join(case_dir, "bf16"))
        del model

        refs = {}
        for ref, folder in (("f32", "f32"), ("bf16_f32", "bf16"), ("bf16_bf16", "bf16")):
            m = AutoModelForCausalLM.from_pretrained(os.path.join(case_dir, folder), dtype=torch.float32,
                                                     attn_implementation="eager").eval()
            assert all(p.dtype == torch.float32 for p in m.parameters())
            if ref == "bf16_bf16":
                assert round_linear_inputs_to_bf16(m) == 7 * fields["num_hidden_layers"] + 1
            logits_file = ref + ".prompt_logits.f32"
            gen, top5, gap = reference(m, prompts, os.path.join(case_dir, logits_file))
            refs[ref] = {"model": folder, "prompt_logits": logits_file, "generated": gen, "top5": top5,
                         "min_top2_gap": gap}
            print(f"{name} {ref}: smallest top-1 - top-2 logit gap over the greedy steps {gap:.6f}", flush=True)
            del m
        # The GGUF holds the f32 model's very weights: the same reference.
        refs["gguf"] = dict(refs["f32"], model="gguf")
        manifest["cases"].append({
            "name": name,
            "architecture": json.load(open(os.path.join(case_dir, "f32", "config.json")))["architectures"][0],
            "tie_word_embeddings": fields["tie_word_embeddings"],
            "rope_theta": fields["rope_theta"],
            "rope_scaling": fields.get("rope_scaling"),
            "refs": refs,
        })
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f)


if __name__ == "__main__":
    main()
