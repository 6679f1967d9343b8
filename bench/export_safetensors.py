#!/usr/bin/env python3
"""Writes SmolLM2-135M-Instruct as Hugging Face safetensors folders, for
BM_LoadModel (bench/micro_bench.cpp) to compare a safetensors load with the
GGUF one on the same weights:

  models/smollm2-135m-instruct-f32-safetensors   (F32, 538 MB)
  models/smollm2-135m-instruct-bf16-safetensors  (BF16, 269 MB)

transformers loads the GGUF (`gguf_file=`, dequantized to F32 by the `gguf`
package, llama.cpp's q/k permutation undone), and the state dict goes to
`model.safetensors` (tied lm_head left out, as save_pretrained does) beside
a config.json and the tokenizer files transformers writes.

Usage (from the repository root, with the test venv):
  ~/.cache/shardline/venv/bin/python bench/export_safetensors.py
"""
import json
import os

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

SOURCE = "models/smollm2-135m-instruct"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main():
    model = AutoModelForCausalLM.from_pretrained(SOURCE, gguf_file=GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(SOURCE, gguf_file=GGUF)
    for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        out = f"models/smollm2-135m-instruct-{name}-safetensors"
        os.makedirs(out, exist_ok=True)
        tensors = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()
                   if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
        save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the GGUF's; these tensors are plain
        config["architectures"] = ["LlamaForCausalLM"]
        config["torch_dtype"] = config["dtype"] = "float32" if dtype == torch.float32 else "bfloat16"
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
        tokenizer.save_pretrained(out)
        print(out)


if __name__ == "__main__":
    main()
