// Reference dequantization of llama.cpp's GGML types (ggml_quants.hpp). Each
// function mirrors ggml-quants.c's dequantize_row_* statement for statement;
// this file is compiled with -ffp-contract=off (kernels/CMakeLists.txt) so
// `a * b + c` is never fused into one rounding.
#include "kernels/cpu/ggml_quants.hpp"

#include <array>
#include <cstring>

#include "common/dtype.hpp"

namespace shardline::kernels {
namespace {

constexpr int kQkK = 256;  // QK_K: elements of a K-quant super-block

[[nodiscard]] inline float half_at(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// ---- 32-element blocks -------------------------------------------------------

void dequantize_q4_0(const std::uint8_t* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += 18, y += 32) {
    const float d = half_at(x);
    const std::uint8_t* qs = x + 2;
    for (int j = 0; j < 16; ++j) {
      const int x0 = (qs[j] & 0x0F) - 8;
      const int x1 = (qs[j] >> 4) - 8;
      y[j] = static_cast<float>(x0) * d;
      y[j + 16] = static_cast<float>(x1) * d;
    }
  }
}

void dequantize_q4_1(const std::uint8_t* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += 20, y += 32) {
    const float d = half_at(x);
    const float m = half_at(x + 2);
    const std::uint8_t* qs = x + 4;
    for (int j = 0; j < 16; ++j) {
      const int x0 = qs[j] & 0x0F;
      const int x1 = qs[j] >> 4;
      y[j] = static_cast<float>(x0) * d + m;
      y[j + 16] = static_cast<float>(x1) * d + m;
    }
  }
}

void dequantize_q5_0(const std::uint8_t* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += 22, y += 32) {
    const float d = half_at(x);
    std::uint32_t qh;
    std::memcpy(&qh, x + 2, 4);
    const std::uint8_t* qs = x + 6;
    for (int j = 0; j < 16; ++j) {
      const std::uint8_t xh_0 = static_cast<std::uint8_t>(((qh >> (j + 0)) << 4) & 0x10);
      const std::uint8_t xh_1 = static_cast<std::uint8_t>((qh >> (j + 12)) & 0x10);
      const int x0 = ((qs[j] & 0x0F) | xh_0) - 16;
      const int x1 = ((qs[j] >> 4) | xh_1) - 16;
      y[j] = static_cast<float>(x0) * d;
      y[j + 16] = static_cast<float>(x1) * d;
    }
  }
}

void dequantize_q5_1(const std::uint8_t* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += 24, y += 32) {
    const float d = half_at(x);
    const float m = half_at(x + 2);
    std::uint32_t qh;
    std::memcpy(&qh, x + 4, 4);
    const std::uint8_t* qs = x + 8;
    for (int j = 0; j < 16; ++j) {
      const std::uint8_t xh_0 = static_cast<std::uint8_t>(((qh >> (j + 0)) << 4) & 0x10);
      const std::uint8_t xh_1 = static_cast<std::uint8_t>((qh >> (j + 12)) & 0x10);
      const int x0 = (qs[j] & 0x0F) | xh_0;
      const int x1 = (qs[j] >> 4) | xh_1;
      y[j] = static_cast<float>(x0) * d + m;
      y[j + 16] = static_cast<float>(x1) * d + m;
    }
  }
}

void dequantize_q8_0(const std::uint8_t* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += 34, y += 32) {
    const float d = half_at(x);
    const auto* qs = reinterpret_cast<const std::int8_t*>(x + 2);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
}

// ---- K-quants (256-element super-blocks) ---------------------------------------

void dequantize_q2_k(const std::uint8_t* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += 84) {
    const std::uint8_t* scales = x;
    const std::uint8_t* q = x + 16;
    const float d = half_at(x + 80);
    const float min = half_at(x + 82);
    int is = 0;
    for (int n = 0; n < kQkK; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        std::uint8_t sc = scales[is++];
        float dl = d * static_cast<float>(sc & 0xF), ml = min * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>(static_cast<std::int8_t>((q[l] >> shift) & 3)) - ml;
        sc = scales[is++];
        dl = d * static_cast<float>(sc & 0xF), ml = min * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>(static_cast<std::int8_t>((q[l + 16] >> shift) & 3)) - ml;
        shift += 2;
      }
      q += 32;
    }
  }
}

void dequantize_q3_k(const std::uint8_t* x, float* y, std::int64_t nb) {
  constexpr std::uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  for (std::int64_t i = 0; i < nb; ++i, x += 110) {
    const std::uint8_t* hm = x;
    const std::uint8_t* q = x + 32;
    const float d_all = half_at(x + 108);
    std::array<std::uint32_t, 4> aux{};
    std::memcpy(aux.data(), x + 96, 12);
    const std::uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    std::array<std::int8_t, 16> scales{};
    std::memcpy(scales.data(), aux.data(), 16);
    int is = 0;
    std::uint8_t m = 1;
    for (int n = 0; n < kQkK; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        float dl = d_all * static_cast<float>(scales[is++] - 32);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>(static_cast<std::int8_t>((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
        dl = d_all * static_cast<float>(scales[is++] - 32);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>(static_cast<std::int8_t>((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
        shift += 2;
        m = static_cast<std::uint8_t>(m << 1);
      }
      q += 32;
    }
  }
}

/// ggml-quants.c's get_scale_min_k4: the 6-bit scale and min of sub-block j.
inline void scale_min_k4(int j, const std::uint8_t* q, std::uint8_t* d, std::uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

void dequantize_q4_k(const std::uint8_t* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += 144) {
    const float d = half_at(x);
    const float min = half_at(x + 2);
    const std::uint8_t* scales = x + 4;
    const std::uint8_t* q = x + 16;
    int is = 0;
    std::uint8_t sc, m;
    for (int j = 0; j < kQkK; j += 64) {
      scale_min_k4(is + 0, scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = min * static_cast<float>(m);
      scale_min_k4(is + 1, scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc);
      const float m2 = min * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

void dequantize_q5_k(const std::uint8_t* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += 176) {
    const float d = half_at(x);
    const float min = half_at(x + 2);
    const std::uint8_t* scales = x + 4;
    const std::uint8_t* qh = x + 16;
    const std::uint8_t* ql = x + 48;
    int is = 0;
    std::uint8_t sc, m;
    std::uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < kQkK; j += 64) {
      scale_min_k4(is + 0, scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = min * static_cast<float>(m);
      scale_min_k4(is + 1, scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc);
      const float m2 = min * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 = static_cast<std::uint8_t>(u1 << 2);
      u2 = static_cast<std::uint8_t>(u2 << 2);
    }
  }
}

void dequantize_q6_k(const std::uint8_t* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += 210) {
    const std::uint8_t* ql = x;
    const std::uint8_t* qh = x + 128;
    const auto* sc = reinterpret_cast<const std::int8_t*>(x + 192);
    const float d = half_at(x + 208);
    for (int n = 0; n < kQkK; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const auto q1 = static_cast<std::int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const auto q2 = static_cast<std::int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const auto q3 = static_cast<std::int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const auto q4 = static_cast<std::int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

void dequantize_q8_k(const std::uint8_t* x, float* y, std::int64_t nb) {
  for (std::int64_t i = 0; i < nb; ++i, x += 292, y += kQkK) {
    float d;
    std::memcpy(&d, x, 4);
    const auto* qs = reinterpret_cast<const std::int8_t*>(x + 4);
    for (int j = 0; j < kQkK; ++j) y[j] = d * static_cast<float>(qs[j]);
  }
}

constexpr std::array<GgmlTypeTraits, 15> kTraits = {{
    {GgmlType::f32, "F32", 1, 4, true},
    {GgmlType::f16, "F16", 1, 2, true},
    {GgmlType::q4_0, "Q4_0", 32, 18, true},
    {GgmlType::q4_1, "Q4_1", 32, 20, true},
    {GgmlType::q5_0, "Q5_0", 32, 22, true},
    {GgmlType::q5_1, "Q5_1", 32, 24, true},
    {GgmlType::q8_0, "Q8_0", 32, 34, true},
    {GgmlType::q8_1, "Q8_1", 32, 36, false},
    {GgmlType::q2_k, "Q2_K", kQkK, 84, true},
    {GgmlType::q3_k, "Q3_K", kQkK, 110, true},
    {GgmlType::q4_k, "Q4_K", kQkK, 144, true},
    {GgmlType::q5_k, "Q5_K", kQkK, 176, true},
    {GgmlType::q6_k, "Q6_K", kQkK, 210, true},
    {GgmlType::q8_k, "Q8_K", kQkK, 292, true},
    {GgmlType::bf16, "BF16", 1, 2, true},
}};

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(std::uint32_t type) noexcept {
  for (const GgmlTypeTraits& t : kTraits)
    if (static_cast<std::uint32_t>(t.type) == type) return t;
  return std::nullopt;
}

std::string ggml_type_name(std::uint32_t type) {
  if (const auto t = ggml_type_traits(type)) return t->name;
  return "type " + std::to_string(type);
}

std::optional<std::size_t> ggml_row_bytes(std::uint32_t type, std::int64_t num_elements) noexcept {
  const auto t = ggml_type_traits(type);
  if (!t || num_elements < 0 || num_elements % t->block_size != 0) return std::nullopt;
  return static_cast<std::size_t>(num_elements / t->block_size) * static_cast<std::size_t>(t->type_size);
}

Status dequantize_row(GgmlType type, const void* src, float* dst, std::int64_t num_elements) {
  const auto t = ggml_type_traits(static_cast<std::uint32_t>(type));
  if (!t || !t->can_dequantize)
    return make_error(ErrorCode::unsupported,
                      "no dequantization for GGML " + ggml_type_name(static_cast<std::uint32_t>(type)));
  if (num_elements < 0 || num_elements % t->block_size != 0)
    return make_error(ErrorCode::invalid_argument, std::to_string(num_elements) + " elements is not a multiple of " +
                                                       t->name + "'s block of " + std::to_string(t->block_size));
  const auto* x = static_cast<const std::uint8_t*>(src);
  const std::int64_t nb = num_elements / t->block_size;
  switch (type) {
    case GgmlType::f32: std::memcpy(dst, x, static_cast<std::size_t>(num_elements) * 4); break;
    case GgmlType::f16:
      for (std::int64_t i = 0; i < num_elements; ++i) dst[i] = half_at(x + 2 * i);
      break;
    case GgmlType::bf16:
      for (std::int64_t i = 0; i < num_elements; ++i) {
        std::uint16_t h;
        std::memcpy(&h, x + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      break;
    case GgmlType::q4_0: dequantize_q4_0(x, dst, nb); break;
    case GgmlType::q4_1: dequantize_q4_1(x, dst, nb); break;
    case GgmlType::q5_0: dequantize_q5_0(x, dst, nb); break;
    case GgmlType::q5_1: dequantize_q5_1(x, dst, nb); break;
    case GgmlType::q8_0: dequantize_q8_0(x, dst, nb); break;
    case GgmlType::q2_k: dequantize_q2_k(x, dst, nb); break;
    case GgmlType::q3_k: dequantize_q3_k(x, dst, nb); break;
    case GgmlType::q4_k: dequantize_q4_k(x, dst, nb); break;
    case GgmlType::q5_k: dequantize_q5_k(x, dst, nb); break;
    case GgmlType::q6_k: dequantize_q6_k(x, dst, nb); break;
    case GgmlType::q8_k: dequantize_q8_k(x, dst, nb); break;
    case GgmlType::q8_1: break;  // refused above
  }
  return {};
}

}  // namespace shardline::kernels
