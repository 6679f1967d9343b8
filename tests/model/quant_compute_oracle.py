"""The oracle of tests/model/quantized_model_golden_test.cpp: the arithmetic
of llama.cpp's quantized matrix products, emulated in Hugging Face
transformers. The GGUF file is loaded as transformers' users load it
(`from_pretrained(gguf_file=)`: every weight dequantized to float32 by the
`gguf` package), and a forward pre-hook on every nn.Linear (q, k, v, o,
gate, up, down, lm_head) replaces its input x by what llama.cpp multiplies
the quantized weights with: x quantized per 32-element block to Q8 as
quantize_row_q8_0_ref does (d = amax / 127, q = roundf(x / d)) and read
back as F16(d) * q. The products are then float32 matmuls of the exact
dequantized weights with those values, so Shardline's quantized run differs
only by the order of its float32 sums (and Q4_1's F16-rounded block sums,
llama.cpp's `s` field).

Usage: quant_compute_oracle.py MODEL_DIR GGUF_NAME IDS.json OUT_DIR NUM_LAYERS GROUP
With NUM_LAYERS > 0, only the first NUM_LAYERS decoder layers run (then
the final norm and lm_head), as Shardline's num_layers_override. Only the
nn.Linear modules whose name contains GROUP ("lm_head", "self_attn",
"mlp"; "" for all) take rounded inputs: the others compute in plain F32,
as the test's model whose other matrices are dense. IDS.json is a list of token-id lists; writes OUT_DIR/logits_K.f32 (float32
[len(ids_K), vocab] row-major), the prompt logits at every position.
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM


def q8_round_trip(x: torch.Tensor) -> torch.Tensor:
    shape = x.shape
    blocks = x.reshape(-1, 32).to(torch.float32)
    d = blocks.abs().amax(dim=1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    v = blocks * inv
    q = torch.sign(v) * torch.floor(v.abs() + 0.5)  # roundf: half away from zero
    return (q * d.to(torch.float16).to(torch.float32)).reshape(shape)


def main() -> None:
    model_dir, gguf_name, ids_path, out_dir = sys.argv[1:5]
    num_layers, group = int(sys.argv[5]), sys.argv[6]
    torch.set_num_threads(1)  # ctest runs two tests at once on 2 cores
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=gguf_name, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    if num_layers > 0:
        model.model.layers = model.model.layers[:num_layers]
        model.config.num_hidden_layers = num_layers
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and group in name:
            module.register_forward_pre_hook(lambda _m, args: (q8_round_trip(args[0]),) + tuple(args[1:]))
    with torch.no_grad():
        for k, ids in enumerate(json.load(open(ids_path, encoding="utf-8"))):
            out = model(torch.tensor([ids]))
            out.logits[0].to(torch.float32).contiguous().numpy().astype("<f4").tofile(f"{out_dir}/logits_{k}.f32")


if __name__ == "__main__":
    main()
