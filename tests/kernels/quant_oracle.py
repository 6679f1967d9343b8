"""The oracle of tests/kernels/quant_linear_test.cpp: quantizes F32 rows to
Q8_0 with the `gguf` package (llama.cpp's own Python code,
gguf.quants.quantize, the reference of ggml's quantize_row_q8_0_ref).

Usage: quant_oracle.py DIR K
Reads DIR/x.f32 (little-endian float32 rows of K elements) and writes
DIR/x.q8_0 (the rows' Q8_0 blocks, 34 bytes per 32 elements).
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize


def main() -> None:
    folder, k = sys.argv[1], int(sys.argv[2])
    x = np.fromfile(f"{folder}/x.f32", dtype="<f4").reshape(-1, k)
    quantize(x, GGMLQuantizationType.Q8_0).tofile(f"{folder}/x.q8_0")


if __name__ == "__main__":
    main()
