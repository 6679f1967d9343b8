"""The oracle of tests/kernels/quant_linear_test.cpp: quantizes F32 rows to
GGUF blocks with the `gguf` package (llama.cpp's own Python code,
gguf.quants.quantize, bit-exact with ggml's quantize_row_*_ref).

Q8_K (the activations of Q4_K and Q6_K weights) is the one type `gguf`
does not quantize; for it this script writes out ggml-quants.c's
quantize_row_q8_K_ref in numpy float32 arithmetic: per 256 values, max =
the first of largest magnitude, iscale = -127 / max, values
MIN(127, nearest_int(iscale * x)) with nearest_int's round half to even
through the float's mantissa (x + 12582912), d = 1 / iscale, bsums the
sums of each 16 values; an all-zero block is d = 0 and zeros.

Usage: quant_oracle.py DIR K TYPE
Reads DIR/x.f32 (little-endian float32 rows of K elements) and writes
DIR/x.blocks (the rows' blocks of TYPE: Q8_0, Q4_0, Q4_1 or Q8_K).
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize


def q8_k(x: np.ndarray) -> bytes:
    out = bytearray()
    for block in x.reshape(-1, 256).astype(np.float32):
        at = int(np.argmax(np.abs(block)))  # the first of largest magnitude
        if block[at] == 0:
            out += np.float32(0).tobytes() + bytes(256) + bytes(32)
            continue
        iscale = np.float32(-127.0) / block[at]
        shifted = (iscale * block).astype(np.float32) + np.float32(12582912.0)
        v = (shifted.view(np.int32) & 0x007FFFFF) - 0x00400000
        qs = np.minimum(127, v).astype(np.int8)
        bsums = qs.astype(np.int32).reshape(16, 16).sum(axis=1).astype("<i2")
        out += (np.float32(1.0) / iscale).astype("<f4").tobytes() + qs.tobytes() + bsums.tobytes()
    return bytes(out)


def main() -> None:
    folder, k, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    x = np.fromfile(f"{folder}/x.f32", dtype="<f4").reshape(-1, k)
    if name == "Q8_K":
        with open(f"{folder}/x.blocks", "wb") as f:
            f.write(q8_k(x))
        return
    quantize(x, GGMLQuantizationType[name]).tofile(f"{folder}/x.blocks")


if __name__ == "__main__":
    main()
