"""The oracle of tests/kernels/quant_linear_test.cpp: quantizes F32 rows to
GGUF blocks with the `gguf` package (llama.cpp's own Python code,
gguf.quants.quantize, bit-exact with ggml's quantize_row_*_ref).

Usage: quant_oracle.py DIR K TYPE
Reads DIR/x.f32 (little-endian float32 rows of K elements) and writes
DIR/x.blocks (the rows' blocks of TYPE: Q8_0, Q4_0 or Q4_1).
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize


def main() -> None:
    folder, k, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    x = np.fromfile(f"{folder}/x.f32", dtype="<f4").reshape(-1, k)
    quantize(x, GGMLQuantizationType[name]).tofile(f"{folder}/x.blocks")


if __name__ == "__main__":
    main()
