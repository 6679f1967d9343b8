"""The oracle of tests/kernels/ggml_quants_test.cpp: dequantizes raw GGML
blocks with the `gguf` package (llama.cpp's own Python reader,
gguf.quants.dequantize).

Q8_K is the one listed type `gguf` does not dequantize; for it this script
writes out ggml-quants.c's dequantize_row_q8_K (y = d * qs, d an f32 and qs
256 int8 per 292-byte block, 16 int16 bsums after them unused) in numpy.

Usage: ggml_quants_oracle.py DIR NAME...
Reads DIR/NAME.bin (whole blocks of GGML type NAME, e.g. Q4_K) and writes
DIR/NAME.f32 (little-endian float32, the dequantized elements).
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize


def q8_k(blocks: np.ndarray) -> np.ndarray:
    blocks = blocks.reshape(-1, 292)
    d = blocks[:, :4].copy().view(np.float32)       # (n, 1)
    qs = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
    return (d * qs).reshape(-1)


def main() -> None:
    folder = sys.argv[1]
    for name in sys.argv[2:]:
        raw = np.fromfile(f"{folder}/{name}.bin", dtype=np.uint8)
        if name == "Q8_K":
            out = q8_k(raw)
        else:
            qtype = GGMLQuantizationType[name]
            out = dequantize(raw, qtype)
        np.ascontiguousarray(out, dtype=np.float32).reshape(-1).astype("<f4").tofile(f"{folder}/{name}.f32")


if __name__ == "__main__":
    main()
