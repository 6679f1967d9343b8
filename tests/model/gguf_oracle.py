"""The oracle of tests/model/gguf_golden_test.cpp: Hugging Face transformers
runs a GGUF model the way its users do (`from_pretrained(..., gguf_file=)`,
which dequantizes every tensor with the `gguf` package into float32 and
undoes llama.cpp's q/k permutation), with the tokenizer and chat template
transformers builds from the same file.

For each conversation of PROMPTS.json (a list of message lists) it writes:
  - the prompt ids (the chat template applied with add_generation_prompt,
    then encoded without adding specials, as transformers' apply_chat_template
    with tokenize=True does);
  - the prompt logits at every position (float32, OUT/logits_K.f32,
    [num_prompt_tokens, vocab] row-major);
  - NUM_NEW greedy ids (argmax at each step, no stop on EOS).

Usage: gguf_oracle.py MODEL_DIR GGUF_NAME PROMPTS.json NUM_NEW OUT_DIR
Writes OUT_DIR/oracle.json: {"vocab": V, "cases": [{"prompt_text", "prompt_ids", "greedy_ids"}]}.
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    model_dir, gguf_name, prompts_path, num_new, out_dir = sys.argv[1:6]
    num_new = int(num_new)
    torch.manual_seed(0)
    # One thread: ctest runs two tests at once on 2 cores, and torch's pool
    # spinning against another process made a decode step 30x slower.
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=gguf_name, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    conversations = json.load(open(prompts_path, encoding="utf-8"))
    cases = []
    with torch.no_grad():
        for k, messages in enumerate(conversations):
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            out = model(torch.tensor([ids]), use_cache=True)
            out.logits[0].to(torch.float32).contiguous().numpy().astype("<f4").tofile(f"{out_dir}/logits_{k}.f32")
            past = out.past_key_values
            nxt = int(out.logits[0, -1].argmax())
            greedy = [nxt]
            for _ in range(num_new - 1):
                out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = int(out.logits[0, -1].argmax())
                greedy.append(nxt)
            cases.append({"prompt_text": text, "prompt_ids": ids, "greedy_ids": greedy})
    json.dump({"vocab": model.config.vocab_size, "cases": cases}, open(f"{out_dir}/oracle.json", "w"))


if __name__ == "__main__":
    main()
