// Dense kernels for the fused PPO update and the fused GRU unroll (see cpu_kernels.h).
//
// Gemm is register-blocked: a tile of R rows x V vectors of c is held in registers while k runs over the
// whole depth; each step loads V vectors of b's row k, broadcasts R values of a and issues R x V
// multiply-adds. Tiles: AVX-512 4 x 4 x 16 floats (16 of 32 zmm registers), AVX2 4 x 2 x 8 (8 of 16 ymm),
// baseline 4 x 2 x 4 (SSE2). Columns left over are done a vector, then an element, at a time.
#include "learner/model/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace farm::kernels {
namespace {

#if defined(__GNUC__) || defined(__clang__)
#define FARM_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define FARM_ALWAYS_INLINE inline
#endif

// A vector of W floats (GCC/Clang vector extensions; scalar operands broadcast).
template <int W>
struct VecOf;
template <>
struct VecOf<16> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct VecOf<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct VecOf<4> {
  typedef float type __attribute__((vector_size(16)));
};

// W int32 lanes, for the bit manipulation of floats of a VecOf<W> (casts between the two reinterpret the bits).
template <int W>
struct IntVecOf {
  typedef int32_t type __attribute__((vector_size(W * 4)));
};

// Vectors travel by reference, never by value: these templates are compiled for several instruction sets.
template <int W>
FARM_ALWAYS_INLINE void Load(typename VecOf<W>::type& v, const float* p) {
  std::memcpy(&v, p, sizeof(v));  // an unaligned load
}
template <int W>
FARM_ALWAYS_INLINE void Store(float* p, const typename VecOf<W>::type& v) {
  std::memcpy(p, &v, sizeof(v));
}

// One R x (V * W) tile of c = bias + a b (see Gemm).
template <int W, int R, int V>
FARM_ALWAYS_INLINE void Tile(int64_t depth, const float* a, int64_t a_row, int64_t a_depth, const float* b,
                             int64_t b_row, float* c, int64_t c_row, const float* bias) {
  using Vec = typename VecOf<W>::type;
  Vec acc[R][V];
  for (int v = 0; v < V; ++v) {
    Vec init{};
    if (bias != nullptr) Load<W>(init, bias + v * W);
    for (int r = 0; r < R; ++r) acc[r][v] = init;
  }
  for (int64_t k = 0; k < depth; ++k) {
    Vec row[V];
    for (int v = 0; v < V; ++v) Load<W>(row[v], b + k * b_row + v * W);
    for (int r = 0; r < R; ++r) {
      const float s = a[r * a_row + k * a_depth];
      for (int v = 0; v < V; ++v) acc[r][v] += s * row[v];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) Store<W>(c + r * c_row + v * W, acc[r][v]);
  }
}

// Columns [j, j + V * W) of c, all rows.
template <int W, int R, int V>
FARM_ALWAYS_INLINE void ColumnBlock(int64_t rows, int64_t j, int64_t depth, const float* a, int64_t a_row,
                                    int64_t a_depth, const float* b, int64_t b_row, float* c, int64_t c_row,
                                    const float* bias) {
  const float* bias_j = bias != nullptr ? bias + j : nullptr;
  int64_t i = 0;
  for (; i + R <= rows; i += R)
    Tile<W, R, V>(depth, a + i * a_row, a_row, a_depth, b + j, b_row, c + i * c_row + j, c_row, bias_j);
  for (; i < rows; ++i)
    Tile<W, 1, V>(depth, a + i * a_row, a_row, a_depth, b + j, b_row, c + i * c_row + j, c_row, bias_j);
}

template <int W, int R, int V>
FARM_ALWAYS_INLINE void GemmImpl(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t a_row,
                                 int64_t a_depth, const float* b, int64_t b_row, float* c, int64_t c_row,
                                 const float* bias) {
  int64_t j = 0;
  for (; j + V * W <= cols; j += V * W)
    ColumnBlock<W, R, V>(rows, j, depth, a, a_row, a_depth, b, b_row, c, c_row, bias);
  for (; j + W <= cols; j += W) ColumnBlock<W, R, 1>(rows, j, depth, a, a_row, a_depth, b, b_row, c, c_row, bias);
  for (; j < cols; ++j) {  // fewer than W columns left
    for (int64_t i = 0; i < rows; ++i) {
      float sum = bias != nullptr ? bias[j] : 0.0f;
      for (int64_t k = 0; k < depth; ++k) sum += a[i * a_row + k * a_depth] * b[k * b_row + j];
      c[i * c_row + j] = sum;
    }
  }
}

template <int W>
FARM_ALWAYS_INLINE void RowDotImpl(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t a_row,
                                   const float* w, float* c, int64_t c_row, const float* bias) {
  using Vec = typename VecOf<W>::type;
  for (int64_t i = 0; i < rows; ++i) {
    const float* x = a + i * a_row;
    for (int64_t j = 0; j < cols; ++j) {
      const float* wj = w + j * depth;
      Vec acc{};
      int64_t k = 0;
      for (; k + W <= depth; k += W) {
        Vec xv, wv;
        Load<W>(xv, x + k);
        Load<W>(wv, wj + k);
        acc += xv * wv;
      }
      float sum = 0;
      for (int l = 0; l < W; ++l) sum += acc[l];
      for (; k < depth; ++k) sum += x[k] * wj[k];
      c[i * c_row + j] = sum + (bias != nullptr ? bias[j] : 0.0f);
    }
  }
}

// tanh(x) = x + x z P(z), z = x^2, for |x| < 0.625 (P: a degree-4 least-squares fit of the relative error,
// < 5e-9 before rounding). Beyond, with t = exp(-2|x|) (no cancellation: t <= e^-1.25), tanh(|x|) =
// (1 - t) / (1 + t), exp(v) = 2^n exp(r) with n = round(v / ln 2), |r| <= ln 2 / 2, exp(r) = 1 + r + r^2 Q(r)
// (Q fitted likewise, < 4e-9). Measured against double tanh: within 1.5 ulp. Branch-free: selects, not jumps.
template <int W>
FARM_ALWAYS_INLINE void TanhImpl(float* __restrict values, int64_t count) {
  constexpr float kP0 = -0.33333279205957494f, kP1 = 0.1333138126984327f, kP2 = -0.053735310580833154f,
                  kP3 = 0.020626261605471683f, kP4 = -0.0056919488129588648f;
  constexpr float kQ0 = 0.49999988595113953f, kQ1 = 0.16666518459971366f, kQ2 = 0.04166953310860709f,
                  kQ3 = 0.0083689163422216908f, kQ4 = 0.0013751407942949056f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187045e-06f;  // ln 2 = hi + lo, hi exact
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: (v + magic) - magic rounds v to an integer
  // W lanes at a time, written with vector types: GCC does not if-convert the scalar loop's selects, so the loop
  // below it alone ran one element at a time (4.2 ns per element on an AVX2 core; this, 8 lanes at once).
  using Vec = typename VecOf<W>::type;
  using IVec = typename IntVecOf<W>::type;
  const Vec kLimit = Vec{} + 20.0f, kSmall = Vec{} + 0.625f, kMinExp = Vec{} - 64.0f, kZero = Vec{};
  int64_t k = 0;
  for (; k + W <= count; k += W) {
    Vec x;
    Load<W>(x, values + k);
    const IVec x_bits = (IVec)x;
    Vec a = (Vec)(x_bits & 0x7fffffff);
    a = kLimit < a ? kLimit : a;  // as std::min: a NaN stays NaN
    const Vec z = a * a;
    const Vec small = a + a * z * (kP0 + z * (kP1 + z * (kP2 + z * (kP3 + z * kP4))));
    const Vec v = -2.0f * a;
    const Vec n = (v * kLog2e + kRoundMagic) - kRoundMagic;
    const Vec r = (v - n * kLn2Hi) - n * kLn2Lo;
    const Vec exp_r = 1.0f + r + r * r * (kQ0 + r * (kQ1 + r * (kQ2 + r * (kQ3 + r * kQ4))));
    const Vec n_bits = n >= kMinExp ? n : kZero;
    const Vec t = exp_r * (Vec)((__builtin_convertvector(n_bits, IVec) + 127) << 23);
    const Vec large = (1.0f - t) / (1.0f + t);
    const Vec magnitude = a < kSmall ? small : large;
    Store<W>(values + k, (Vec)(((IVec)magnitude & 0x7fffffff) | (x_bits & static_cast<int32_t>(0x80000000u))));
  }
  for (; k < count; ++k) {
    const float x = values[k];
    const float a = std::min(std::fabs(x), 20.0f);  // tanh(20) rounds to 1; keeps 2^n a normal float
    const float z = a * a;
    const float small = a + a * z * (kP0 + z * (kP1 + z * (kP2 + z * (kP3 + z * kP4))));
    const float v = -2.0f * a;
    const float n = (v * kLog2e + kRoundMagic) - kRoundMagic;
    const float r = (v - n * kLn2Hi) - n * kLn2Lo;
    const float exp_r = 1.0f + r + r * r * (kQ0 + r * (kQ1 + r * (kQ2 + r * (kQ3 + r * kQ4))));
    // n is in [-58, 0] for finite x; a NaN x makes n NaN, whose conversion to int would be undefined: 0
    // instead (the NaN still reaches the result through r).
    const float n_bits = n >= -64.0f ? n : 0.0f;
    const float t = exp_r * __builtin_bit_cast(float, (static_cast<int32_t>(n_bits) + 127) << 23);  // * 2^n
    const float large = (1.0f - t) / (1.0f + t);
    values[k] = std::copysign(a < 0.625f ? small : large, x);
  }
}

FARM_ALWAYS_INLINE void MulTanhGradImpl(float* __restrict g, const float* __restrict y, int64_t count) {
  for (int64_t k = 0; k < count; ++k) g[k] *= 1.0f - y[k] * y[k];
}

FARM_ALWAYS_INLINE void SumRowsImpl(const float* __restrict g, int64_t rows, int64_t cols, float* __restrict out) {
  std::fill(out, out + cols, 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = g + i * cols;
    for (int64_t j = 0; j < cols; ++j) out[j] += row[j];
  }
}

template <int W>
FARM_ALWAYS_INLINE double SumSquaresImpl(const float* values, int64_t count) {
  using Vec = typename VecOf<W>::type;
  Vec acc{};
  int64_t k = 0;
  for (; k + W <= count; k += W) {
    Vec v;
    Load<W>(v, values + k);
    acc += v * v;
  }
  double sum = 0;
  for (int l = 0; l < W; ++l) sum += acc[l];
  for (; k < count; ++k) sum += static_cast<double>(values[k]) * values[k];
  return sum;
}

FARM_ALWAYS_INLINE void AdamImpl(float* __restrict p, float* __restrict m, float* __restrict v,
                                 const float* __restrict g, int64_t count, const AdamCoefficients& c) {
  const float b1 = c.beta1, ob1 = c.one_minus_beta1, b2 = c.beta2, ob2 = c.one_minus_beta2;
  const float sqrt_bc2 = c.sqrt_bias_correction2, eps = c.eps, step = c.step_size;
  for (int64_t k = 0; k < count; ++k) {
    m[k] = m[k] * b1 + g[k] * ob1;
    v[k] = v[k] * b2 + g[k] * g[k] * ob2;
    p[k] -= step * (m[k] / (std::sqrt(v[k]) / sqrt_bc2 + eps));
  }
}

struct Table {
  decltype(&Gemm) gemm;
  decltype(&GemmRowDot) row_dot;
  decltype(&Tanh) tanh;
  decltype(&MulTanhGrad) tanh_grad;
  decltype(&SumRows) sum_rows;
  decltype(&SumSquares) sum_squares;
  decltype(&AdamUpdate) adam;
  const char* name;
};

// One set of entry points per instruction set: the same templates, compiled for that target.
#define FARM_KERNEL_SET(SUFFIX, TARGET, W, R, V)                                                                       \
  TARGET void Gemm##SUFFIX(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t a_row, int64_t a_depth,  \
                           const float* b, int64_t b_row, float* c, int64_t c_row, const float* bias) {                \
    GemmImpl<W, R, V>(rows, cols, depth, a, a_row, a_depth, b, b_row, c, c_row, bias);                                 \
  }                                                                                                                    \
  TARGET void RowDot##SUFFIX(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t a_row, const float* w, \
                             float* c, int64_t c_row, const float* bias) {                                             \
    RowDotImpl<W>(rows, cols, depth, a, a_row, w, c, c_row, bias);                                                     \
  }                                                                                                                    \
  TARGET void Tanh##SUFFIX(float* values, int64_t count) { TanhImpl<W>(values, count); }                               \
  TARGET void MulTanhGrad##SUFFIX(float* g, const float* y, int64_t count) { MulTanhGradImpl(g, y, count); }           \
  TARGET void SumRows##SUFFIX(const float* g, int64_t rows, int64_t cols, float* out) {                                \
    SumRowsImpl(g, rows, cols, out);                                                                                   \
  }                                                                                                                    \
  TARGET double SumSquares##SUFFIX(const float* values, int64_t count) { return SumSquaresImpl<W>(values, count); }    \
  TARGET void Adam##SUFFIX(float* p, float* m, float* v, const float* g, int64_t count, const AdamCoefficients& c) {   \
    AdamImpl(p, m, v, g, count, c);                                                                                    \
  }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FARM_KERNELS_X86 1
FARM_KERNEL_SET(Avx512, __attribute__((target("avx512f,fma"))), 16, 4, 4)
FARM_KERNEL_SET(Avx2, __attribute__((target("avx2,fma"))), 8, 4, 2)
#endif
FARM_KERNEL_SET(Baseline, , 4, 4, 2)

const Table& Kernels() {
  static const Table table = [] {
#ifdef FARM_KERNELS_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) {
      return Table{GemmAvx512,    RowDotAvx512,     TanhAvx512, MulTanhGradAvx512,
                   SumRowsAvx512, SumSquaresAvx512, AdamAvx512, "avx512"};
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      return Table{GemmAvx2, RowDotAvx2, TanhAvx2, MulTanhGradAvx2, SumRowsAvx2, SumSquaresAvx2, AdamAvx2, "avx2"};
    }
#endif
    return Table{GemmBaseline,    RowDotBaseline,     TanhBaseline, MulTanhGradBaseline,
                 SumRowsBaseline, SumSquaresBaseline, AdamBaseline, "baseline"};
  }();
  return table;
}

}  // namespace

void Gemm(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t a_row, int64_t a_depth, const float* b,
          int64_t b_row, float* c, int64_t c_row, const float* bias) {
  Kernels().gemm(rows, cols, depth, a, a_row, a_depth, b, b_row, c, c_row, bias);
}

void GemmRowDot(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t a_row, const float* w, float* c,
                int64_t c_row, const float* bias) {
  Kernels().row_dot(rows, cols, depth, a, a_row, w, c, c_row, bias);
}

void Tanh(float* values, int64_t count) { Kernels().tanh(values, count); }

void MulTanhGrad(float* g, const float* y, int64_t count) { Kernels().tanh_grad(g, y, count); }

void SumRows(const float* g, int64_t rows, int64_t cols, float* out) { Kernels().sum_rows(g, rows, cols, out); }

double SumSquares(const float* values, int64_t count) { return Kernels().sum_squares(values, count); }

void AdamUpdate(float* p, float* m, float* v, const float* g, int64_t count, const AdamCoefficients& c) {
  Kernels().adam(p, m, v, g, count, c);
}

const char* InstructionSet() { return Kernels().name; }

}  // namespace farm::kernels
