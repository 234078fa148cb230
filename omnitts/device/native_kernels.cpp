// omnitts' CPU kernels: y = x W^T + b for weights packed once into column panels, RMSNorm (alone, and
// fused with q and k's rotary embedding), SwiGLU's silu(gate) * up, SnakeBeta (channels-first and
// channels-last), attention for one query per row, and the transforms and layout changes of the
// codec's Winograd convolutions.
//
// Built on the machine that runs it (omnitts/device/native.py compiles this file with -march=native
// and caches the library), so the instruction set is the CPU's own: AVX-512 (float32, and bfloat16
// where the CPU has AVX512-BF16, its linears on AMX tiles where it has those too) or AVX2 + FMA
// (float32). Registered as torch operators
// omnitts::pack_linear, omnitts::linear, omnitts::rms_norm, omnitts::norm_rope, omnitts::silu_mul,
// omnitts::snake, omnitts::snake_channels_last, omnitts::decode_attention, omnitts::wino_input,
// omnitts::wino_output, omnitts::transpose_pad, omnitts::vectorised_float32, omnitts::amx (whether bfloat16
// linears run on AMX) and omnitts::dtypes (which dtypes this build runs); threads are torch's own (at::parallel_for).
//
// Layout: a weight [N, K] is stored as N/16 panels of [K][16] (float32) or [K/2][16][2] (bfloat16: the
// pairs VDPBF16PS multiplies, or that float32 widens with a shift and a mask), the last panel zero-padded. A panel is one contiguous stream, so a
// batch-1 product reads the weight front to back at close to the memory's streaming rate, where a
// row-major GEMV keeps one stream per row in flight.
//
// Every output is one accumulator summed over k in order (one fused multiply-add per k in float32,
// one pair per step in bfloat16), whatever the number of rows and however the work is tiled or
// threaded: a row's result does not depend on the batch it is computed in (bitwise).
//
// omnitts::rms_norm is models/layers.RMSNorm in one pass instead of six kernels (square, mean, add,
// rsqrt, scale, weight): the same roundings (x * rsqrt(mean + eps) rounded to x's dtype, then times
// the weight), the sum of squares in another order.
//
// omnitts::snake is models/codec.SnakeBeta, x + inv_beta * sin(x * alpha)^2 per channel, in one pass. In
// bfloat16 instead of five: each operation rounded to bfloat16 as torch's would be, and the sine torch's
// own (SLEEF's 1-ulp sine, which torch's vectorised bfloat16 sin calls): bitwise torch's result. In
// float32 (AVX-512 builds) instead of three, with SLEEF's 3.5-ulp sine: about 1e-7 relative of torch's.
//
// omnitts::decode_attention is softmax(scale * K q) V for one query per row, in float32 over a float32 or
// bfloat16 key/value history, one task per (row, KV head) so each key and value is read once for the
// query heads it serves (see below).
//
// Built with -ffp-contract=off: a product and a sum written apart are rounded apart (never fused).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>
#include <immintrin.h>
#include <sleef.h>

#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>
#include <optional>
#include <vector>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <cstdlib>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

constexpr int kPanel = 16;  // outputs per panel

#if defined(__AVX512F__)
// Sixteen bfloat16 values widened to float32, exactly: a bfloat16's bits are a float's top half.
inline __m512 widen_bf16(__m256i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); }

// Sixteen float32 values, or sixteen bfloat16 ones widened (exactly), from p on.
inline __m512 load_row(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_row(const uint16_t* p) { return widen_bf16(_mm256_loadu_si256((const __m256i*)p)); }
inline __m512 load_row(const at::BFloat16* p) { return load_row(reinterpret_cast<const uint16_t*>(p)); }

// The first min(n, 16) lanes (a row's tail, for masked loads and stores).
inline __mmask16 first_lanes(int64_t n) { return n >= kPanel ? 0xFFFF : (__mmask16)((1u << n) - 1); }

// Sixteen float32 lanes in one register.
struct Vec {
  __m512 v;
  static Vec zero() { return {_mm512_setzero_ps()}; }
  static Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
  // From sixteen (k, k + 1) pairs of bfloat16 weights, k's or k + 1's widened exactly: by a shift or by a
  // mask (where loading sixteen bfloat16 alone costs a widening shuffle each).
  static Vec load_even(const uint16_t* p) { return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16))}; }
  static Vec load_odd(const uint16_t* p) {
    return {_mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32((int)0xFFFF0000u)))};
  }
  void fma(const Vec& w, float x) { v = _mm512_fmadd_ps(w.v, _mm512_set1_ps(x), v); }
  void store(float* out, const float* bias, int n) const {
    __mmask16 mask = first_lanes(n);
    __m512 r = bias ? _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias)) : v;
    _mm512_mask_storeu_ps(out, mask, r);
  }
};
constexpr int kMaxRows = 8, kMaxPanels = 3;  // 24 accumulators of 32 registers (a batch of 8 in one tile)
#elif defined(__AVX2__) && defined(__FMA__)
// Sixteen float32 lanes in two registers.
struct Vec {
  __m256 lo, hi;
  static Vec zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Vec load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static Vec load_even(const uint16_t* p) {  // as the AVX-512 ones, in two halves
    auto half = [](const uint16_t* q) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i*)q), 16)); };
    return {half(p), half(p + 16)};
  }
  static Vec load_odd(const uint16_t* p) {
    auto half = [](const uint16_t* q) {
      return _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256((const __m256i*)q), _mm256_set1_epi32((int)0xFFFF0000u)));
    };
    return {half(p), half(p + 16)};
  }
  void fma(const Vec& w, float x) {
    __m256 b = _mm256_set1_ps(x);
    lo = _mm256_fmadd_ps(w.lo, b, lo);
    hi = _mm256_fmadd_ps(w.hi, b, hi);
  }
  void store(float* out, const float* bias, int n) const {
    alignas(32) float r[kPanel];
    _mm256_store_ps(r, lo);
    _mm256_store_ps(r + 8, hi);
    for (int j = 0; j < std::min(n, kPanel); ++j) out[j] = bias ? r[j] + bias[j] : r[j];
  }
};
constexpr int kMaxRows = 3, kMaxPanels = 2;  // 12 accumulators of 16 registers
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define OMNITTS_HAVE_F32 1

// rows x panels outputs of 16: acc[r][p] += W[p][k][:] * x[r][k], k = 0..K-1 in order.
template <typename W, int R, int P>
void tile_f32(const W* w, int64_t panel_stride, const float* x, int64_t ldx, int64_t K,
              float* y, int64_t ldy, const float* bias, int64_t n_left) {
  Vec acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = Vec::zero();
  auto accumulate = [&](const Vec* wv, int64_t k) {  // acc[r][p] += wv[p] * x[r][k]
    for (int r = 0; r < R; ++r) {
      float xv = x[r * ldx + k];
      for (int p = 0; p < P; ++p) acc[r][p].fma(wv[p], xv);
    }
  };
  Vec wv[P];
  if constexpr (std::is_same_v<W, uint16_t>) {  // bfloat16 weights in (k, k + 1) pairs, K rounded up to even
    for (int64_t k = 0; k < K; k += 2) {
      for (int p = 0; p < P; ++p) wv[p] = Vec::load_even(w + p * panel_stride + k * kPanel);
      accumulate(wv, k);
      if (k + 1 == K) break;  // an odd K's last k: its partner is padding
      for (int p = 0; p < P; ++p) wv[p] = Vec::load_odd(w + p * panel_stride + k * kPanel);  // again, from L1
      accumulate(wv, k + 1);
    }
  } else {
    for (int64_t k = 0; k < K; ++k) {
      for (int p = 0; p < P; ++p) wv[p] = Vec::load(w + p * panel_stride + k * kPanel);
      accumulate(wv, k);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) {
      int64_t n = n_left - (int64_t)p * kPanel;
      if (n > 0) acc[r][p].store(y + r * ldy + p * kPanel, bias ? bias + p * kPanel : nullptr, (int)std::min<int64_t>(n, kPanel));
    }
}

template <typename W>
using TileF32 = void (*)(const W*, int64_t, const float*, int64_t, int64_t, float*, int64_t, const float*, int64_t);

template <typename W, int R, int... P>
constexpr auto row_of_tiles(std::integer_sequence<int, P...>) {
  return std::array<TileF32<W>, sizeof...(P)>{&tile_f32<W, R, P + 1>...};
}
template <typename W, int... R>
constexpr auto table_of_tiles(std::integer_sequence<int, R...>) {
  return std::array<std::array<TileF32<W>, kMaxPanels>, sizeof...(R)>{
      row_of_tiles<W, R + 1>(std::make_integer_sequence<int, kMaxPanels>{})...};
}
// float32 weights, and bfloat16-stored weights computed in float32 (widened as they are read)
const auto kTilesF32 = table_of_tiles<float>(std::make_integer_sequence<int, kMaxRows>{});
const auto kTilesF32Narrow = table_of_tiles<uint16_t>(std::make_integer_sequence<int, kMaxRows>{});
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define OMNITTS_HAVE_BF16 1

// As tile_f32 for bfloat16: each step multiplies a pair of k (VDPBF16PS) into float32 sums; the
// result is rounded to bfloat16 (nearest even) after the bias is added in float32.
template <int R, int P>
void tile_bf16(const uint16_t* w, int64_t panel_stride, const uint16_t* x, int64_t ldx, int64_t K,
               uint16_t* y, int64_t ldy, const uint16_t* bias, int64_t n_left) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 2) {
    __m512bh wv[P];
    for (int p = 0; p < P; ++p) wv[p] = (__m512bh)_mm512_loadu_si512(w + p * panel_stride + k * kPanel);
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * ldx + k, sizeof(pair));
      __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], wv[p], xv);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) {
      int64_t n = n_left - (int64_t)p * kPanel;
      if (n <= 0) continue;
      __mmask16 mask = first_lanes(n);
      __m512 v = acc[r][p];
      if (bias) v = _mm512_add_ps(v, widen_bf16(_mm256_maskz_loadu_epi16(mask, bias + p * kPanel)));
      __m256i out = (__m256i)_mm512_cvtneps_pbh(v);
      _mm256_mask_storeu_epi16(y + r * ldy + p * kPanel, mask, out);
    }
}

using TileBF16 = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, uint16_t*, int64_t, const uint16_t*, int64_t);

template <int R, int... P>
constexpr auto row_of_tiles_bf16(std::integer_sequence<int, P...>) {
  return std::array<TileBF16, sizeof...(P)>{&tile_bf16<R, P + 1>...};
}
template <int... R>
constexpr auto table_of_tiles_bf16(std::integer_sequence<int, R...>) {
  return std::array<std::array<TileBF16, kMaxPanels>, sizeof...(R)>{
      row_of_tiles_bf16<R + 1>(std::make_integer_sequence<int, kMaxPanels>{})...};
}
const auto kTilesBF16 = table_of_tiles_bf16(std::make_integer_sequence<int, kMaxRows>{});
#endif

#if defined(OMNITTS_HAVE_BF16) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define OMNITTS_HAVE_AMX 1
// bfloat16 on AMX (Intel Xeon from Sapphire Rapids on): TDPBF16PS multiplies a 16 x 32 tile of inputs by a
// 32 x 16 tile of weights into 16 x 16 float32 sums. The packed panel [K/2][16][2] is exactly AMX's weight
// tile layout, so 32 k of a panel are one contiguous 1 KiB tile (16 rows of 64 bytes). Rows go in blocks of
// 16 (the last block, and a K that is not a multiple of 32, are copied into zero-padded scratch: zeros add
// nothing), and each output's sum runs over its k in chunks of 32, in order, the same way whatever the
// number of rows, the block or the thread: as row-invariant as the VDPBF16PS tiles above, in another order
// than theirs (so a model computes the same on every AMX CPU, about an ulp of bfloat16 from a non-AMX one).
// Linux hands the tile registers' state to a process that asks for it (arch_prctl, kernel 5.16 and later);
// where it refuses, the VDPBF16PS tiles run. `OMNITTS_AMX=0` keeps them too.

constexpr int64_t kAmxK = 32;      // k per tile step (16 pairs)
constexpr int64_t kAmxRows = 16;   // rows per block
constexpr int64_t kAmxAhead = 4;   // steps a panel's weights are prefetched ahead (one block)

struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool amx_granted() {
  static const bool granted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

bool amx_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("OMNITTS_AMX");
    return !(env && std::strcmp(env, "0") == 0) && amx_granted();
  }();
  return enabled;
}

// Every tile is up to 16 rows of 64 bytes. Two blocks (all rows 16): tiles 0-3 the sums of (row block b,
// panel p) at 2b + p, 4 and 5 the blocks' inputs, 6 and 7 the two panels' weights. One block of `rows` rows:
// tiles 0-3 the four panels' sums and 4 the inputs, `rows` rows each (a short block costs fewer tile rows,
// and the rows are read from x as they are), 5-7 weights.
void amx_configure(int rows) {
  AmxConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = t <= 4 ? rows : 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// One step of B row blocks x P panels: sums += inputs (a: B blocks of 16 rows, lda bytes apart) x weights
// (w: P panel tiles, 1 KiB each, wstride bytes apart). Tile numbers must be constants, hence the template.
template <int B, int P>
inline void amx_step(const char* a, int64_t lda, int64_t block_bytes, const char* w, int64_t wstride) {
  if constexpr (P == 4) {  // one block, four panels: the weights' tiles 5-7, then 5 again
    static_assert(B == 1);
    _tile_loadd(4, a, lda);
    _tile_loadd(5, w, 64);
    _tile_loadd(6, w + wstride, 64);
    _tile_loadd(7, w + 2 * wstride, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, w + 3 * wstride, 64);
    _tile_dpbf16ps(3, 4, 5);
    return;
  }
  _tile_loadd(4, a, lda);
  if constexpr (B == 2) _tile_loadd(5, a + block_bytes, lda);
  _tile_loadd(6, w, 64);
  if constexpr (P == 2) _tile_loadd(7, w + wstride, 64);
  _tile_dpbf16ps(0, 4, 6);
  if constexpr (P == 2) _tile_dpbf16ps(1, 4, 7);
  if constexpr (B == 2) _tile_dpbf16ps(2, 5, 6);
  if constexpr (B == 2 && P == 2) _tile_dpbf16ps(3, 5, 7);
}

// B row blocks x P panels of outputs. a: the blocks' inputs (16 rows each, lda bytes per row, K32 columns
// readable: zero past K); w: the first panel (panel_stride elements apart), K2 of its k real (zero past K2:
// the tail chunk is copied into `tail`). Writes rows [m0, m0 + rows) and outputs [n0, n0 + 16 P) of y.
template <int B, int P>
void amx_tile(const uint16_t* a, int64_t lda, const uint16_t* w, int64_t panel_stride, int64_t K2, uint16_t* y,
              int64_t ldy, const uint16_t* bias, int64_t n_left, int rows, uint16_t* tail) {
  // Sums of (block b, panel p) in tile 2 b + p (four panels of one block: tile p).
  _tile_zero(0);
  if constexpr (P >= 2) _tile_zero(1);
  if constexpr (B == 2 || P == 4) _tile_zero(2);
  if constexpr ((B == 2 && P == 2) || P == 4) _tile_zero(3);
  const int64_t block_bytes = kAmxRows * lda, wstride = panel_stride * 2;
  int64_t k = 0;
  for (; k + kAmxK <= K2; k += kAmxK) {
    if constexpr (P == 4) {  // memory-bound: ask for each panel's tiles kAmxAhead steps early
      for (int p = 0; p < 4; ++p)
        for (int line = 0; line < 16; ++line)
          _mm_prefetch((const char*)(w + p * panel_stride + (k + kAmxAhead * kAmxK) * kPanel) + 64 * line, _MM_HINT_T0);
    }
    amx_step<B, P>((const char*)(a + k), lda, block_bytes, (const char*)(w + k * kPanel), wstride);
  }
  if (k < K2) {  // the last k, fewer than 32: each panel's into zero-padded scratch (1 KiB a panel)
    for (int p = 0; p < P; ++p) {
      std::memset(tail + p * kAmxK * kPanel, 0, kAmxK * kPanel * 2);
      std::memcpy(tail + p * kAmxK * kPanel, w + p * panel_stride + k * kPanel, (K2 - k) * kPanel * 2);
    }
    amx_step<B, P>((const char*)(a + k), lda, block_bytes, (const char*)tail, kAmxK * kPanel * 2);
  }
  alignas(64) float sums[4][kAmxRows * kPanel];
  _tile_stored(0, sums[0], 64);
  if constexpr (P >= 2) _tile_stored(1, sums[1], 64);
  if constexpr (B == 2 || P == 4) _tile_stored(2, sums[2], 64);
  if constexpr ((B == 2 && P == 2) || P == 4) _tile_stored(3, sums[3], 64);
  for (int b = 0; b < B; ++b)
    for (int p = 0; p < P; ++p) {
      int64_t n = n_left - (int64_t)p * kPanel;
      if (n <= 0) continue;
      __mmask16 mask = first_lanes(n);
      __m512 bv = bias ? widen_bf16(_mm256_maskz_loadu_epi16(mask, bias + p * kPanel)) : _mm512_setzero_ps();
      for (int r = 0; r < std::min<int>(kAmxRows, rows - b * kAmxRows); ++r) {
        __m512 v = _mm512_load_ps(sums[P == 4 ? p : 2 * b + p] + r * kPanel);
        if (bias) v = _mm512_add_ps(v, bv);
        _mm256_mask_storeu_epi16(y + (b * kAmxRows + r) * ldy + p * kPanel, mask, (__m256i)_mm512_cvtneps_pbh(v));
      }
    }
}

// y [M, N] = x [M, K] W^T (+ bias) in bfloat16, W packed [panels, K2/2, 16, 2] (K2 = K rounded up to even).
void amx_linear(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, int64_t panels, uint16_t* y, int64_t N,
                const uint16_t* bias) {
  const int64_t K2 = (K + 1) / 2 * 2, K32 = (K2 + kAmxK - 1) / kAmxK * kAmxK, stride = K2 * kPanel;
  const int64_t blocks = (M + kAmxRows - 1) / kAmxRows;
  // Inputs as whole blocks (of 16 rows, or of M < 16 alone) with readable, zero k up to K32: x itself where it
  // is that already.
  std::vector<uint16_t> padded;
  const uint16_t* a = x;
  int64_t lda = K;
  if ((blocks > 1 && M % kAmxRows != 0) || K != K32) {
    padded.assign(blocks * kAmxRows * K32, 0);
    for (int64_t m = 0; m < M; ++m) std::memcpy(padded.data() + m * K32, x + m * K, K * 2);
    a = padded.data();
    lda = K32;
  }
  // One block of rows (up to 16): four panels at a time, the weights streamed four at once (the rows are
  // too few to reuse them; memory-bound). More: two blocks by two panels (each weight tile used twice).
  if (blocks == 1) {
    at::parallel_for(0, (panels + 3) / 4, 1, [&](int64_t g0, int64_t g1) {
      amx_configure((int)M);
      alignas(64) uint16_t tail[4 * kAmxK * kPanel];
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t p0 = 4 * g, n_left = N - p0 * kPanel;
        const uint16_t* wp = w + p0 * stride;
        const uint16_t* bp = bias ? bias + p0 * kPanel : nullptr;
        switch (std::min<int64_t>(4, panels - p0)) {
          case 4: amx_tile<1, 4>(a, lda * 2, wp, stride, K2, y + p0 * kPanel, N, bp, n_left, (int)M, tail); break;
          case 3:  // three panels: two, then one
            amx_tile<1, 2>(a, lda * 2, wp, stride, K2, y + p0 * kPanel, N, bp, n_left, (int)M, tail);
            amx_tile<1, 1>(a, lda * 2, wp + 2 * stride, stride, K2, y + (p0 + 2) * kPanel, N,
                           bp ? bp + 2 * kPanel : nullptr, n_left - 2 * kPanel, (int)M, tail);
            break;
          case 2: amx_tile<1, 2>(a, lda * 2, wp, stride, K2, y + p0 * kPanel, N, bp, n_left, (int)M, tail); break;
          default: amx_tile<1, 1>(a, lda * 2, wp, stride, K2, y + p0 * kPanel, N, bp, n_left, (int)M, tail);
        }
      }
      _tile_release();
    });
    return;
  }
  const int64_t groups = (panels + 1) / 2;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    amx_configure(kAmxRows);
    alignas(64) uint16_t tail[4 * kAmxK * kPanel];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = 2 * g;
      const bool two = p0 + 1 < panels;
      const uint16_t* wp = w + p0 * stride;
      const uint16_t* bp = bias ? bias + p0 * kPanel : nullptr;
      for (int64_t b0 = 0; b0 < blocks; b0 += 2) {
        const uint16_t* ab = a + b0 * kAmxRows * lda;
        uint16_t* yb = y + b0 * kAmxRows * N + p0 * kPanel;
        const int rows = (int)std::min<int64_t>(2 * kAmxRows, M - b0 * kAmxRows);
        const int64_t n_left = N - p0 * kPanel;
        const int64_t ldab = lda * 2;
        if (b0 + 1 < blocks) {
          if (two) amx_tile<2, 2>(ab, ldab, wp, stride, K2, yb, N, bp, n_left, rows, tail);
          else amx_tile<2, 1>(ab, ldab, wp, stride, K2, yb, N, bp, n_left, rows, tail);
        } else {
          if (two) amx_tile<1, 2>(ab, ldab, wp, stride, K2, yb, N, bp, n_left, rows, tail);
          else amx_tile<1, 1>(ab, ldab, wp, stride, K2, yb, N, bp, n_left, rows, tail);
        }
      }
    }
    _tile_release();
  });
}
#endif

// Runs `tile(rows, panels, row0, panel0)` over the whole output: groups of up to kMaxPanels panels
// are shared out between threads; each group walks all rows (its panels stay in cache meanwhile).
template <typename F>
void for_each_tile(int64_t M, int64_t panels, F tile) {
#if defined(OMNITTS_HAVE_F32)
  int64_t groups = (panels + kMaxPanels - 1) / kMaxPanels;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      int64_t p0 = g * kMaxPanels;
      int p = (int)std::min<int64_t>(kMaxPanels, panels - p0);
      for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) tile((int)std::min<int64_t>(kMaxRows, M - m0), p, m0, p0);
    }
  });
#endif
}

// The packed weight for computing in `dtype`, zero-padded to whole panels:
//   float32 from float32:   [panels, K, 16] float32
//   float32 from bfloat16:  [panels, K'/2, 16, 2] bfloat16 (K' = K rounded up to even, the odd tail zero):
//                           widened to float32 as the kernel reads it (exact: the same products as float32
//                           weights, from half the bytes), a pair of k at a time
//   bfloat16:               [panels, K/2, 16, 2] bfloat16 (the pairs VDPBF16PS multiplies)
int64_t packed_depth(int64_t K, c10::ScalarType stored) { return stored == at::kBFloat16 ? (K + 1) / 2 * 2 : K; }

// Into `out` where given (memory the caller chose, e.g. on huge pages), which must be exactly that shape and dtype.
at::Tensor pack_linear(const at::Tensor& weight, c10::ScalarType dtype, const c10::optional<at::Tensor>& into) {
  TORCH_CHECK(weight.dim() == 2, "pack_linear: weight must be 2-D, got ", weight.sizes());
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "pack_linear: float32 or bfloat16 only");
  int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(dtype == at::kFloat || K % 2 == 0, "pack_linear: bfloat16 needs an even input size, got ", K);
  int64_t panels = (N + kPanel - 1) / kPanel;
  auto stored = dtype == at::kFloat && weight.scalar_type() == at::kBFloat16 ? at::kBFloat16 : dtype;
  int64_t depth = packed_depth(K, stored);
  at::Tensor w = weight.to(stored).contiguous();
  at::Tensor out;
  if (into.has_value() && into->defined()) {
    out = *into;
    TORCH_CHECK(out.scalar_type() == stored && out.dim() == 2 && out.size(0) == panels &&
                    out.size(1) == depth * kPanel && out.is_contiguous(),
                "pack_linear: out must be a contiguous ", stored, " [", panels, ", ", depth * kPanel, "], got ",
                out.scalar_type(), " ", out.sizes());
  } else {
    out = at::empty({panels, depth * kPanel}, weight.options().dtype(stored));
  }
  int64_t elem = w.element_size();
  const char* src = (const char*)w.data_ptr();
  char* dst = (char*)out.data_ptr();
  int64_t group = stored == at::kBFloat16 ? 2 : 1;  // consecutive k kept together per output
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      char* panel = dst + p * depth * kPanel * elem;
      int64_t rows = std::min<int64_t>(kPanel, N - p * kPanel);
      if (rows < kPanel || depth > K) std::memset(panel, 0, depth * kPanel * elem);
      const char* first = src + p * kPanel * K * elem;
      // Written in order (reading 16 rows side by side): the panel is one sequential stream.
      for (int64_t k = 0; k < K; k += group) {
        int64_t n = std::min<int64_t>(group, K - k);
        for (int64_t j = 0; j < rows; ++j)
          std::memcpy(panel + (k * kPanel + j * group) * elem, first + (j * K + k) * elem, n * elem);
      }
    }
  });
  return out;
}

// `amx`: bfloat16 on AMX where this CPU and build have it (`amx()`); false runs the VDPBF16PS tiles.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                  const c10::optional<at::Tensor>& bias, bool amx) {
  int64_t K = x.size(-1);
  bool narrow = x.scalar_type() == at::kFloat && packed.scalar_type() == at::kBFloat16;  // float32 from bfloat16
  TORCH_CHECK(x.scalar_type() == packed.scalar_type() || narrow, "linear: input is ", x.scalar_type(), ", weight ",
              packed.scalar_type());
  int64_t stride = packed_depth(K, packed.scalar_type()) * kPanel;
  TORCH_CHECK(packed.dim() == 2 && packed.size(1) == stride, "linear: packed weight does not match input size ", K);
  int64_t panels = packed.size(0);
  TORCH_CHECK(out_features <= panels * kPanel && out_features > (panels - 1) * kPanel, "linear: bad out_features");
  at::Tensor x2 = x.reshape({-1, K}).contiguous();
  int64_t M = x2.size(0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out_features;
  at::Tensor y = at::empty(shape, x.options());
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->to(x.scalar_type()).contiguous();
    TORCH_CHECK(b.numel() == out_features, "linear: bias has ", b.numel(), " values for ", out_features, " outputs");
  }
  if (M == 0) return y;
  // One tile table over the whole output: weights w, inputs xp, outputs yp, bias bp (or null).
  auto run = [&](const auto* w, const auto* xp, auto* yp, const auto* bp, const auto& tiles) {
    for_each_tile(M, panels, [&](int rows, int p, int64_t m0, int64_t p0) {
      tiles[rows - 1][p - 1](w + p0 * stride, stride, xp + m0 * K, K, K, yp + m0 * out_features + p0 * kPanel,
                             out_features, bp ? bp + p0 * kPanel : nullptr, out_features - p0 * kPanel);
    });
    return y;
  };
  if (x.scalar_type() == at::kFloat) {
#if defined(OMNITTS_HAVE_F32)
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    if (narrow)
      return run((const uint16_t*)packed.data_ptr(), x2.data_ptr<float>(), y.data_ptr<float>(), bp, kTilesF32Narrow);
    return run(packed.data_ptr<float>(), x2.data_ptr<float>(), y.data_ptr<float>(), bp, kTilesF32);
#endif
  } else if (x.scalar_type() == at::kBFloat16) {
#if defined(OMNITTS_HAVE_BF16)
    const uint16_t* bp = b.defined() ? (const uint16_t*)b.data_ptr() : nullptr;
#if defined(OMNITTS_HAVE_AMX)
    if (amx && amx_enabled()) {
      amx_linear((const uint16_t*)x2.data_ptr(), M, K, (const uint16_t*)packed.data_ptr(), panels,
                 (uint16_t*)y.data_ptr(), out_features, bp);
      return y;
    }
#endif
    return run((const uint16_t*)packed.data_ptr(), (const uint16_t*)x2.data_ptr(), (uint16_t*)y.data_ptr(), bp,
               kTilesBF16);
#endif
  }
  TORCH_CHECK(false, "linear: no kernel for ", x.scalar_type(), " on this CPU");
}

// y = (x * rsqrt(mean(x^2) + eps)) rounded to x's dtype, times weight (rounded again), one row of D.
template <typename T>
inline void norm_row(const T* xr, const T* wr, T* yr, int64_t D, float eps) {
  auto to_float = [](T v) { return static_cast<float>(v); };
  float lanes[16] = {0};
  int64_t d = 0;
  for (; d + 16 <= D; d += 16)
    for (int j = 0; j < 16; ++j) { float v = to_float(xr[d + j]); lanes[j] += v * v; }
  float sum = 0.f;
  for (int j = 0; j < 16; ++j) sum += lanes[j];
  for (; d < D; ++d) { float v = to_float(xr[d]); sum += v * v; }
  float scale = 1.f / std::sqrt(sum / (float)D + eps);
  for (d = 0; d < D; ++d) {
    T normed = static_cast<T>(to_float(xr[d]) * scale);
    yr[d] = static_cast<T>(to_float(normed) * to_float(wr[d]));
  }
}

// norm_row over rows: weight is [D] or [G, D], row r using weight row r % G (q and k heads normed
// together, each with its own weight).
template <typename T>
void rms_norm_rows(const T* x, const T* w, T* y, int64_t rows, int64_t D, int64_t G, float eps) {
  at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) norm_row(x + r * D, w + (r % G) * D, y + r * D, D, eps);
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "rms_norm: input is ", x.scalar_type(), ", weight ", weight.scalar_type());
  int64_t D = x.size(-1);
  TORCH_CHECK(weight.size(-1) == D && weight.numel() % D == 0, "rms_norm: weight ", weight.sizes(), " for rows of ", D);
  int64_t G = weight.numel() / D;
  at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  int64_t rows = xc.numel() / D;
  TORCH_CHECK(rows % G == 0, "rms_norm: ", rows, " rows are not whole groups of ", G);
  at::Tensor y = at::empty(x.sizes(), x.options());
  if (x.scalar_type() == at::kFloat) {
    rms_norm_rows(xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), rows, D, G, (float)eps);
  } else if (x.scalar_type() == at::kBFloat16) {
    rms_norm_rows(xc.data_ptr<at::BFloat16>(), wc.data_ptr<at::BFloat16>(), y.data_ptr<at::BFloat16>(), rows, D, G, (float)eps);
  } else {
    TORCH_CHECK(false, "rms_norm: float32 or bfloat16 only, got ", x.scalar_type());
  }
  return y;
}

// omnitts::norm_rope is layers.apply_rope(rms_norm(x).transpose(1, 2), cos, sin) in one pass: x
// (B, T, G, D), any strides but a contiguous last dimension (the q and k heads of the fused
// projection, a view), weight (G, D), cos and signed sin (B or 1, T, D) -> (B, G, T, D). Each row is
// normed as rms_norm does, then rotated with apply_rope's three roundings to x's dtype: roll(n) * sin,
// n * cos, their sum. Bitwise the unfused kernels' result; one call instead of about eight.
template <typename T>
void norm_rope_rows(const at::Tensor& x, const T* w, const T* cos, const T* sin, int64_t cos_batch_stride,
                    T* y, float eps) {
  int64_t B = x.size(0), Tn = x.size(1), G = x.size(2), D = x.size(3), half = D / 2;
  const T* xp = (const T*)x.data_ptr();
  int64_t sb = x.stride(0), st = x.stride(1), sg = x.stride(2);
  at::parallel_for(0, B * Tn * G, 32, [&](int64_t r0, int64_t r1) {
    std::vector<T> normed(D);
    for (int64_t r = r0; r < r1; ++r) {
      int64_t b = r / (Tn * G), t = r / G % Tn, g = r % G;
      norm_row(xp + b * sb + t * st + g * sg, w + g * D, normed.data(), D, eps);
      const T* c = cos + b * cos_batch_stride + t * D;
      const T* s = sin + b * cos_batch_stride + t * D;
      T* out = y + ((b * G + g) * Tn + t) * D;
      auto rotate = [&](int64_t j, int64_t partner) {
        T rolled = static_cast<T>(static_cast<float>(normed[partner]) * static_cast<float>(s[j]));
        T direct = static_cast<T>(static_cast<float>(normed[j]) * static_cast<float>(c[j]));
        out[j] = static_cast<T>(static_cast<float>(rolled) + static_cast<float>(direct));
      };
      for (int64_t j = 0; j < half; ++j) rotate(j, j + half);
      for (int64_t j = half; j < D; ++j) rotate(j, j - half);
    }
  });
}

at::Tensor norm_rope(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                     const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1, "norm_rope: x must be (B, T, G, D) with a contiguous last dimension");
  int64_t B = x.size(0), Tn = x.size(1), G = x.size(2), D = x.size(3);
  TORCH_CHECK(D % 2 == 0, "norm_rope: odd head size ", D);
  auto dtype = x.scalar_type();
  TORCH_CHECK(weight.scalar_type() == dtype && cos.scalar_type() == dtype && sin.scalar_type() == dtype,
              "norm_rope: x, weight, cos and sin must share one dtype");
  TORCH_CHECK(weight.numel() == G * D, "norm_rope: weight ", weight.sizes(), " for ", G, " heads of ", D);
  TORCH_CHECK(cos.dim() == 3 && cos.sizes() == sin.sizes() && cos.size(1) == Tn && cos.size(2) == D &&
              (cos.size(0) == B || cos.size(0) == 1), "norm_rope: cos/sin ", cos.sizes(), " for x ", x.sizes());
  at::Tensor w = weight.contiguous(), c = cos.contiguous(), s = sin.contiguous();
  int64_t cb = cos.size(0) == 1 ? 0 : Tn * D;
  at::Tensor y = at::empty({B, G, Tn, D}, x.options());
  if (y.numel() == 0) return y;
  if (dtype == at::kFloat) {
    norm_rope_rows(x, w.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), cb, y.data_ptr<float>(),
                   (float)eps);
  } else if (dtype == at::kBFloat16) {
    norm_rope_rows(x, w.data_ptr<at::BFloat16>(), c.data_ptr<at::BFloat16>(), s.data_ptr<at::BFloat16>(), cb,
                   y.data_ptr<at::BFloat16>(), (float)eps);
  } else {
    TORCH_CHECK(false, "norm_rope: float32 or bfloat16 only, got ", dtype);
  }
  return y;
}

#if defined(__AVX512F__)
// SnakeBeta over rows: row (b, c) of x (B, C, T; the last dimension contiguous, rows anywhere) -> y
// contiguous, 16 samples at a time by `lanes(in, out, mask, alpha, inv_beta)`.
template <typename T, typename Lanes>
void snake_rows(const T* x, int64_t batch_stride, int64_t channel_stride, const float* alpha, const float* inv_beta,
                T* y, int64_t B, int64_t C, int64_t length, Lanes lanes) {
  at::parallel_for(0, B * C, std::max<int64_t>(1, 16384 / std::max<int64_t>(length, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + (r / C) * batch_stride + (r % C) * channel_stride;
      T* yr = y + r * length;
      __m512 a = _mm512_set1_ps(alpha[r % C]), ib = _mm512_set1_ps(inv_beta[r % C]);
      for (int64_t t = 0; t < length; t += kPanel) lanes(xr + t, yr + t, first_lanes(length - t), a, ib);
    }
  });
}

template <typename T, typename Lanes>
at::Tensor snake_with(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& inv_beta, Lanes lanes) {
  const int64_t B = x.size(0), C = x.size(1), length = x.size(2);
  at::Tensor xc = x.stride(2) == 1 || length <= 1 ? x : x.contiguous();
  at::Tensor a = alpha.to(at::kFloat).contiguous(), ib = inv_beta.to(at::kFloat).contiguous();
  at::Tensor y = at::empty({B, C, length}, x.options());
  if (y.numel() > 0)
    snake_rows((const T*)xc.data_ptr(), xc.stride(0), xc.stride(1), a.data_ptr<float>(), ib.data_ptr<float>(),
               (T*)y.data_ptr(), B, C, length, lanes);
  return y;
}
#endif

#if defined(OMNITTS_HAVE_BF16)
// bfloat16: computed in float32 and rounded to bfloat16 after every operation, as torch's bfloat16
// operations round; the sine is SLEEF's, as torch's vectorised bfloat16 sin.
inline __m512 round_bf16(__m512 v) { return widen_bf16((__m256i)_mm512_cvtneps_pbh(v)); }

inline void snake_bf16_lanes(const uint16_t* in, uint16_t* out, __mmask16 mask, __m512 a, __m512 ib) {
  __m512 v = widen_bf16(_mm256_maskz_loadu_epi16(mask, in));
  __m512 s = round_bf16(Sleef_sinf16_u10(round_bf16(_mm512_mul_ps(v, a))));  // sin(x * alpha)
  s = round_bf16(_mm512_mul_ps(s, s));                                         // ** 2
  s = round_bf16(_mm512_mul_ps(s, ib));                                        // * inv_beta
  _mm256_mask_storeu_epi16(out, mask, (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(s, v)));  // + x
}
#endif

#if defined(__AVX512F__)
// float32, fused: sin(x * alpha)^2 * inv_beta + x with SLEEF's 3.5-ulp sine (torch's float32 sin is
// MKL's; this is not bitwise it, hence for runs that are not parity runs).
inline void snake_f32_lanes(const float* in, float* out, __mmask16 mask, __m512 a, __m512 ib) {
  __m512 v = _mm512_maskz_loadu_ps(mask, in);
  __m512 s = Sleef_sinf16_u35(_mm512_mul_ps(v, a));
  _mm512_mask_storeu_ps(out, mask, _mm512_fmadd_ps(_mm512_mul_ps(s, s), ib, v));
}
#endif

// x (B, C, T) bfloat16 or float32; alpha and inv_beta (C) in x's dtype, the module's exp and reciprocal
// as it rounds them. float32 only where the build has AVX-512 (`vectorised_float32()`).
at::Tensor snake(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& inv_beta) {
  TORCH_CHECK(x.dim() == 3, "snake: x must be (batch, channels, time), got ", x.sizes());
  const int64_t C = x.size(1);
  TORCH_CHECK(alpha.numel() == C && inv_beta.numel() == C, "snake: ", C, " channels, alpha has ", alpha.numel(),
              ", inv_beta ", inv_beta.numel());
  TORCH_CHECK(alpha.scalar_type() == x.scalar_type() && inv_beta.scalar_type() == x.scalar_type(),
              "snake: parameters must be in x's dtype ", x.scalar_type());
#if defined(OMNITTS_HAVE_BF16)
  if (x.scalar_type() == at::kBFloat16) return snake_with<uint16_t>(x, alpha, inv_beta, snake_bf16_lanes);
#endif
#if defined(__AVX512F__)
  if (x.scalar_type() == at::kFloat) return snake_with<float>(x, alpha, inv_beta, snake_f32_lanes);
#endif
  TORCH_CHECK(false, "snake: bfloat16, or float32 in an AVX-512 build, got ", x.scalar_type());
}

// SnakeBeta over channels-last rows (..., C), float32 (AVX-512): the same arithmetic per value as
// `snake`'s float32 kernel, alpha and inv_beta varying along the row. For the codec's channels-last
// residual units (device/cpu_convs.ChannelsLastResidualUnit).
at::Tensor snake_channels_last(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& inv_beta) {
  const int64_t C = x.size(-1);
  TORCH_CHECK(x.scalar_type() == at::kFloat && alpha.scalar_type() == at::kFloat && inv_beta.scalar_type() == at::kFloat,
              "snake_channels_last: float32 only");
  TORCH_CHECK(alpha.numel() == C && inv_beta.numel() == C, "snake_channels_last: ", C, " channels, alpha has ",
              alpha.numel(), ", inv_beta ", inv_beta.numel());
#if defined(__AVX512F__)
  at::Tensor xc = x.contiguous(), a = alpha.contiguous(), ib = inv_beta.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  const int64_t rows = C ? xc.numel() / C : 0;
  const float *xp = xc.data_ptr<float>(), *ap = a.data_ptr<float>(), *bp = ib.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < C; c += kPanel) {
        __mmask16 mask = first_lanes(C - c);
        snake_f32_lanes(xp + r * C + c, yp + r * C + c, mask, _mm512_maskz_loadu_ps(mask, ap + c),
                        _mm512_maskz_loadu_ps(mask, bp + c));
      }
  });
  return y;
#else
  TORCH_CHECK(false, "snake_channels_last: needs an AVX-512 build");
#endif
}

// omnitts::silu_mul is GatedMLP's silu(gate) * up for x = [gate | up] (rows of 2I, any row stride),
// one pass instead of three kernels, with torch's arithmetic: silu as torch's vectorised AVX-512 kernel
// computes it (x / (1 + exp(-x)) in float32 with SLEEF's 1-ulp exp over pairs of whole vectors, the
// rest of a row with the C library's exp), rounded to x's dtype, then the product rounded again.
// Bitwise torch's result where torch runs its AVX-512 kernels (the caller checks).
#if defined(__AVX512F__)
// float32 -> bfloat16 as c10::BFloat16 rounds finite values (nearest even), the bits in each lane's
// low half; `store_row` packs them, `round_to` widens them back (the value a bfloat16 result holds).
inline __m512i bf16_bits(__m512 v) {
  __m512i bits = _mm512_castps_si512(v);
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
}
inline void store_row(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store_row(at::BFloat16* p, __m512 v) { _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(bf16_bits(v))); }
inline __m512 round_to(float*, __m512 v) { return v; }
inline __m512 round_to(at::BFloat16*, __m512 v) { return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(v), 16)); }

template <typename T>
void silu_mul_rows(const T* x, int64_t row_stride, T* y, int64_t rows, int64_t I) {
  auto to_float = [](T v) { return static_cast<float>(v); };
  const __m512 one = _mm512_set1_ps(1.f);
  // torch's loop takes two vectors of its dtype per step: 64 bfloat16 or 32 float32 values.
  const int64_t whole = I / (sizeof(T) == 2 ? 64 : 32) * (sizeof(T) == 2 ? 64 : 32);
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* gate = x + r * row_stride;
      const T* up = gate + I;
      T* yr = y + r * I;
      for (int64_t i = 0; i < whole; i += 16) {
        __m512 v = load_row(gate + i);
        __m512 silu = _mm512_div_ps(v, _mm512_add_ps(one, Sleef_expf16_u10(_mm512_sub_ps(_mm512_setzero_ps(), v))));
        store_row(yr + i, _mm512_mul_ps(round_to(yr, silu), load_row(up + i)));
      }
      for (int64_t i = whole; i < I; ++i) {
        float v = to_float(gate[i]);
        yr[i] = static_cast<T>(to_float(static_cast<T>(v / (1.f + std::exp(-v)))) * to_float(up[i]));
      }
    }
  });
}
#endif

at::Tensor silu_mul(const at::Tensor& x) {
  const int64_t I = x.size(-1) / 2;
  TORCH_CHECK(x.size(-1) % 2 == 0 && x.stride(-1) == 1, "silu_mul: x must be [gate | up] rows, contiguous within");
  at::Tensor x2 = x.reshape({-1, 2 * I});
  TORCH_CHECK(x2.stride(-1) == 1, "silu_mul: rows must be contiguous");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = I;
  at::Tensor y = at::empty(shape, x.options());
  int64_t rows = x2.size(0), stride = rows > 1 ? x2.stride(0) : 2 * I;
#if defined(__AVX512F__)
  if (y.numel() == 0) return y;
  if (x.scalar_type() == at::kFloat) {
    silu_mul_rows(x2.data_ptr<float>(), stride, y.data_ptr<float>(), rows, I);
    return y;
  }
  if (x.scalar_type() == at::kBFloat16) {
    silu_mul_rows(x2.data_ptr<at::BFloat16>(), stride, y.data_ptr<at::BFloat16>(), rows, I);
    return y;
  }
#endif
  TORCH_CHECK(false, "silu_mul: float32 or bfloat16 in an AVX-512 build, got ", x.scalar_type());
}

// One query per row (decode) over a key history: out[b, h] = softmax(scale * K q) . V in float32, for
// q (B, H, 1, D) float32, k and v (B, Hkv, S, D) float32 or bfloat16 (widened as read: exact, so a
// bfloat16 history gives the float32 result of its widened copy, bitwise) whose last two dimensions
// are contiguous (any row and head strides: a prefix view of a preallocated cache), head h reading KV
// head h / (H / Hkv), and an optional boolean mask broadcastable to (B, 1, 1, S) (True = attend). One
// task per (row, KV head): its keys and values are read once from memory for the query heads it
// serves, where torch's kernel takes one (row, head) at a time. A row's result does not depend on the
// batch (bitwise).
inline float widen(float x) { return x; }
inline float widen(uint16_t x) {
  uint32_t bits = (uint32_t)x << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <typename KV>
float dot_lanes(const float* a, const KV* b, int64_t D) {
  float lanes[16] = {0};
  int64_t d = 0;
  for (; d + 16 <= D; d += 16)
    for (int j = 0; j < 16; ++j) lanes[j] += a[d + j] * widen(b[d + j]);
  float sum = 0.f;
  for (int j = 0; j < 16; ++j) sum += lanes[j];
  for (; d < D; ++d) sum += a[d] * widen(b[d]);
  return sum;
}

#if defined(__AVX512F__)
// The AVX-512 path for head_dim D of 32, 64, 128 or 256 and 1, 2 or 4 query heads per KV head (every
// Qwen3-TTS stack: D 128, 2 query heads per KV head): the group's queries sit in registers, each key
// and value row is loaded (and widened) once for all of them, scores and weights use fused
// multiply-adds and SLEEF's 1-ulp exp. Per row and head the order of operations is fixed, so a row's
// result still does not depend on the batch.

template <typename KV, int G, int C>
void attend_group(const float* q, const KV* kb, const KV* vb, float* out, const bool* mask, int64_t ms, int64_t S,
                  float sc, float* scores) {
  __m512 qv[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) qv[g][c] = _mm512_loadu_ps(q + g * C * 16 + c * 16);
  float top[G];
  for (int g = 0; g < G; ++g) top[g] = -INFINITY;
  for (int64_t j = 0; j < S; ++j) {
    if (mask && !mask[j * ms]) {
      for (int g = 0; g < G; ++g) scores[g * S + j] = -INFINITY;
      continue;
    }
    __m512 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
    for (int c = 0; c < C; ++c) {
      __m512 kv = load_row(kb + j * C * 16 + c * 16);
      for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(qv[g][c], kv, acc[g]);
    }
    for (int g = 0; g < G; ++g) {
      float x = _mm512_reduce_add_ps(acc[g]) * sc;
      scores[g * S + j] = x;
      top[g] = std::max(top[g], x);
    }
  }
  float inv[G];
  for (int g = 0; g < G; ++g) {
    float* p = scores + g * S;
    __m512 mx = _mm512_set1_ps(top[g]), total = _mm512_setzero_ps();
    for (int64_t j = 0; j < S; j += 16) {
      __mmask16 m = first_lanes(S - j);
      __m512 x = _mm512_maskz_loadu_ps(m, p + j);
      __m512 e = _mm512_maskz_mov_ps(m, Sleef_expf16_u10(_mm512_sub_ps(x, mx)));  // exp(-inf) = 0
      _mm512_mask_storeu_ps(p + j, m, e);
      total = _mm512_add_ps(total, e);
    }
    float t = _mm512_reduce_add_ps(total);
    inv[g] = t > 0.f ? 1.f / t : 0.f;
  }
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < S; ++j) {
    if (mask && !mask[j * ms]) continue;
    __m512 w[G];
    for (int g = 0; g < G; ++g) w[g] = _mm512_set1_ps(scores[g * S + j]);
    for (int c = 0; c < C; ++c) {
      __m512 vv = load_row(vb + j * C * 16 + c * 16);
      for (int g = 0; g < G; ++g) acc[g][c] = _mm512_fmadd_ps(w[g], vv, acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + g * C * 16 + c * 16, _mm512_mul_ps(acc[g][c], _mm512_set1_ps(inv[g])));
}

template <typename KV>
using GroupKernel = void (*)(const float*, const KV*, const KV*, float*, const bool*, int64_t, int64_t, float, float*);

template <typename KV, int G>
GroupKernel<KV> group_kernel_for(int64_t chunks) {
  switch (chunks) {
    case 2: return &attend_group<KV, G, 2>;
    case 4: return &attend_group<KV, G, 4>;
    case 8: return &attend_group<KV, G, 8>;
    case 16: return &attend_group<KV, G, 16>;
    default: return nullptr;
  }
}

// The kernel for G query heads per KV head and head_dim D, or nullptr where the generic loop runs.
template <typename KV>
GroupKernel<KV> pick_group_kernel(int64_t G, int64_t D) {
  if (D % 16 != 0) return nullptr;
  switch (G) {
    case 1: return group_kernel_for<KV, 1>(D / 16);
    case 2: return group_kernel_for<KV, 2>(D / 16);
    case 4: return group_kernel_for<KV, 4>(D / 16);
    default: return nullptr;
  }
}
#endif

template <typename KV>
void decode_attention_rows(const float* qp, const KV* kp, const KV* vp, float* op, const bool* mp, int64_t mb,
                           int64_t ms, int64_t B, int64_t H, int64_t Hkv, int64_t S, int64_t D, int64_t ks0,
                           int64_t ks1, int64_t vs0, int64_t vs1, float sc) {
  int64_t G = H / Hkv;
#if defined(__AVX512F__)
  if (auto kernel = pick_group_kernel<KV>(G, D)) {
    at::parallel_for(0, B * Hkv, 1, [&](int64_t t0, int64_t t1) {
      std::vector<float> scores(G * S);
      for (int64_t t = t0; t < t1; ++t) {
        int64_t b = t / Hkv, g = t % Hkv;
        kernel(qp + (b * H + g * G) * D, kp + b * ks0 + g * ks1, vp + b * vs0 + g * vs1, op + (b * H + g * G) * D,
               mp ? mp + b * mb : nullptr, ms, S, sc, scores.data());
      }
    });
    return;
  }
#endif
  at::parallel_for(0, B * Hkv, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> p(S);
    std::vector<float> acc(D);
    for (int64_t t = t0; t < t1; ++t) {
      int64_t b = t / Hkv, g = t % Hkv;
      const KV* kb = kp + b * ks0 + g * ks1;
      const KV* vb = vp + b * vs0 + g * vs1;
      for (int64_t hq = 0; hq < G; ++hq) {
        int64_t h = g * G + hq;
        const float* qh = qp + (b * H + h) * D;
        float top = -INFINITY;
        for (int64_t j = 0; j < S; ++j) {
          if (mp && !mp[b * mb + j * ms]) { p[j] = -INFINITY; continue; }
          p[j] = dot_lanes(qh, kb + j * D, D) * sc;
          top = std::max(top, p[j]);
        }
        float total = 0.f;
        for (int64_t j = 0; j < S; ++j) {
          p[j] = p[j] == -INFINITY ? 0.f : std::exp(p[j] - top);
          total += p[j];
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t j = 0; j < S; ++j) {
          if (p[j] == 0.f) continue;
          const KV* vj = vb + j * D;
          float w = p[j];
          for (int64_t d = 0; d < D; ++d) acc[d] += w * widen(vj[d]);
        }
        float inv = total > 0.f ? 1.f / total : 0.f;
        float* oh = op + (b * H + h) * D;
        for (int64_t d = 0; d < D; ++d) oh[d] = acc[d] * inv;
      }
    }
  });
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const c10::optional<at::Tensor>& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(2) == 1, "decode_attention: q (B, H, 1, D), k/v (B, Hkv, S, D)");
  TORCH_CHECK(q.scalar_type() == at::kFloat, "decode_attention: q must be float32, got ", q.scalar_type());
  TORCH_CHECK(k.scalar_type() == v.scalar_type() && (k.scalar_type() == at::kFloat || k.scalar_type() == at::kBFloat16),
              "decode_attention: k and v both float32 or both bfloat16, got ", k.scalar_type(), " and ", v.scalar_type());
  int64_t B = q.size(0), H = q.size(1), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == B && k.size(3) == D && H % Hkv == 0, "decode_attention: shapes ",
              q.sizes(), " ", k.sizes(), " ", v.sizes());
  for (const auto* t : {&k, &v})
    TORCH_CHECK(t->stride(3) == 1 && (S <= 1 || t->stride(2) == D), "decode_attention: k/v rows of D must be contiguous");
  at::Tensor qc = q.contiguous();
  at::Tensor out = at::empty({B, H, 1, D}, q.options());
  const bool* mp = nullptr;
  int64_t mb = 0, ms = 0;
  at::Tensor m;
  if (mask.has_value() && mask->defined()) {
    m = *mask;
    TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 4 && (m.size(0) == B || m.size(0) == 1) && m.size(1) == 1 &&
                m.size(2) == 1 && m.size(3) == S, "decode_attention: mask must be boolean (B|1, 1, 1, S), got ", m.sizes());
    mp = m.data_ptr<bool>();
    mb = m.size(0) == 1 ? 0 : m.stride(0);
    ms = m.stride(3);
  }
  float sc = (float)scale;
  if (k.scalar_type() == at::kFloat)
    decode_attention_rows(qc.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>(), mp, mb,
                          ms, B, H, Hkv, S, D, k.stride(0), k.stride(1), v.stride(0), v.stride(1), sc);
  else
    decode_attention_rows(qc.data_ptr<float>(), (const uint16_t*)k.data_ptr(), (const uint16_t*)v.data_ptr(),
                          out.data_ptr<float>(), mp, mb, ms, B, H, Hkv, S, D, k.stride(0), k.stride(1), v.stride(0),
                          v.stride(1), sc);
  return out;
}

// Winograd F(m, r) for a dilated kernel-7 convolution (r = 7, cpu_convs.WinogradConv1d) or the
// two-tap polyphase form of a transposed one (r = 2, WinogradConvTranspose1d): the input and output
// transforms around the products (one matrix product per transform point, oneDNN's). Tile
// n = (b * Q + q) * d + r covers outputs p + i * d (i < m) and reads inputs p + j * d (j < alpha =
// m + r - 1) from p = q * m * d + r: dilation d splits a row into d interleaved plain convolutions.
// Channels-last throughout (positions x channels), so a tile's channels are contiguous vectors and the
// products are plain (N, C) x (C, C') GEMMs. Transforms are sums over the points, in order, of
// coefficient times value; the zero coefficients skipped.

inline int64_t tile_start(int64_t n, int64_t m, int64_t d) { return (n / d) * m * d + n % d; }

// sum_j coef[j] * v[j] over A values, in order, the zero coefficients skipped: both transforms' step.
template <int A>
inline float combine(const float* coef, const float* v) {
  float acc = 0.0f;
  for (int j = 0; j < A; ++j)
    if (coef[j] != 0.0f) acc += coef[j] * v[j];
  return acc;
}

#if defined(__AVX512F__)
template <int A>
inline __m512 combine(const float* coef, const __m512* v) {
  __m512 acc = _mm512_setzero_ps();
  for (int j = 0; j < A; ++j)
    if (coef[j] != 0.0f) acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(coef[j]), v[j]));
  return acc;
}
#endif

// U[a][n][c] = sum_j bt[a][j] * x[b][p + j * d][c] (zero past L), n = b * Q * d + tile.
template <int A>
void wino_input_tiles(const float* x, int64_t L, int64_t C, const float* bt, float* U, int64_t B, int64_t m,
                      int64_t d, int64_t Q) {
  const int64_t Qd = Q * d, N = B * Qd;
  at::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t p = tile_start(n % Qd, m, d);
      const float* xb = x + (n / Qd) * L * C;
      for (int64_t c = 0; c < C; c += kPanel) {
#if defined(__AVX512F__)
        const __mmask16 lanes = first_lanes(C - c);
        __m512 v[A];
        for (int j = 0; j < A; ++j)
          v[j] = p + j * d < L ? _mm512_maskz_loadu_ps(lanes, xb + (p + j * d) * C + c) : _mm512_setzero_ps();
        for (int a = 0; a < A; ++a) _mm512_mask_storeu_ps(U + (a * N + n) * C + c, lanes, combine<A>(bt + a * A, v));
#else
        for (int64_t k = c; k < std::min<int64_t>(c + kPanel, C); ++k) {
          float v[A];
          for (int j = 0; j < A; ++j) v[j] = p + j * d < L ? xb[(p + j * d) * C + k] : 0.0f;
          for (int a = 0; a < A; ++a) U[(a * N + n) * C + k] = combine<A>(bt + a * A, v);
        }
#endif
      }
    }
  });
}

// y[b][p + i * d][c] = sum_a at[i][a] * M[a][n][c] + bias[c], for positions < T.
template <int A>
void wino_output_tiles(const float* const* M, const float* at, int64_t m, const float* bias, float* y, int64_t B,
                       int64_t C, int64_t T, int64_t d, int64_t Q) {
  const int64_t Qd = Q * d, N = B * Qd;
  at::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t p = tile_start(n % Qd, m, d);
      float* yb = y + (n / Qd) * T * C;
      for (int64_t c = 0; c < C; c += kPanel) {
#if defined(__AVX512F__)
        const __mmask16 lanes = first_lanes(C - c);
        __m512 v[A];
        for (int a = 0; a < A; ++a) v[a] = _mm512_maskz_loadu_ps(lanes, M[a] + n * C + c);
        const __m512 bc = bias ? _mm512_maskz_loadu_ps(lanes, bias + c) : _mm512_setzero_ps();
        for (int64_t i = 0; i < m && p + i * d < T; ++i) {
          const __m512 acc = combine<A>(at + i * A, v);
          _mm512_mask_storeu_ps(yb + (p + i * d) * C + c, lanes, bias ? _mm512_add_ps(acc, bc) : acc);
        }
#else
        for (int64_t k = c; k < std::min<int64_t>(c + kPanel, C); ++k) {
          float v[A];
          for (int a = 0; a < A; ++a) v[a] = M[a][n * C + k];
          for (int64_t i = 0; i < m && p + i * d < T; ++i) {
            const float acc = combine<A>(at + i * A, v);
            yb[(p + i * d) * C + k] = bias ? acc + bias[k] : acc;
          }
        }
#endif
      }
    }
  });
}

// F(m, r) for r = 7 and m = 2 to 6, or r = 2 and m = 2 to 4: alpha = m + r - 1 points, 3 to 5 or 8 to 12.
void check_wino(int64_t m, int64_t alpha, const char* op) {
  const int64_t r = alpha - m + 1;
  TORCH_CHECK(m >= 2 && ((r == 7 && m <= 6) || (r == 2 && m <= 4)), op,
              ": F(m, r) for r = 7 and m = 2 to 6 or r = 2 and m = 2 to 4, got m ", m, ", alpha ", alpha);
}

// The kernels instantiated per alpha (callers check it with check_wino first).
using WinoInputFn = void (*)(const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t, int64_t, int64_t);
using WinoOutputFn = void (*)(const float* const*, const float*, int64_t, const float*, float*, int64_t, int64_t,
                              int64_t, int64_t, int64_t);

WinoInputFn wino_input_for(int64_t alpha) {
  switch (alpha) {
    case 3: return &wino_input_tiles<3>;
    case 4: return &wino_input_tiles<4>;
    case 5: return &wino_input_tiles<5>;
    case 8: return &wino_input_tiles<8>;
    case 9: return &wino_input_tiles<9>;
    case 10: return &wino_input_tiles<10>;
    case 11: return &wino_input_tiles<11>;
    default: return &wino_input_tiles<12>;
  }
}

WinoOutputFn wino_output_for(int64_t alpha) {
  switch (alpha) {
    case 3: return &wino_output_tiles<3>;
    case 4: return &wino_output_tiles<4>;
    case 5: return &wino_output_tiles<5>;
    case 8: return &wino_output_tiles<8>;
    case 9: return &wino_output_tiles<9>;
    case 10: return &wino_output_tiles<10>;
    case 11: return &wino_output_tiles<11>;
    default: return &wino_output_tiles<12>;
  }
}

// x (B, L, C) float32 channels-last -> U (alpha, B * Q * d, C); bt (alpha, alpha).
at::Tensor wino_input(const at::Tensor& x, const at::Tensor& bt, int64_t m, int64_t d, int64_t Q) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat, "wino_input: x must be float32 (B, L, C), got ",
              x.scalar_type(), " ", x.sizes());
  const int64_t alpha = bt.size(0), B = x.size(0), L = x.size(1), C = x.size(2);
  TORCH_CHECK(bt.dim() == 2 && bt.size(1) == alpha && bt.scalar_type() == at::kFloat, "wino_input: bt must be float32 (alpha, alpha)");
  check_wino(m, alpha, "wino_input");
  TORCH_CHECK(d >= 1 && Q >= 0, "wino_input: bad dilation ", d, " or tile count ", Q);
  at::Tensor xc = x.contiguous(), btc = bt.contiguous();
  at::Tensor U = at::empty({alpha, B * Q * d, C}, x.options());
  if (U.numel() == 0) return U;
  auto run = wino_input_for(alpha);
  run(xc.data_ptr<float>(), L, C, btc.data_ptr<float>(), U.data_ptr<float>(), B, m, d, Q);
  return U;
}

// M: alpha tensors (B * Q * d, C) float32 -> y (B, T, C) channels-last; at (m, alpha); bias (C) or none.
at::Tensor wino_output(const std::vector<at::Tensor>& M, const at::Tensor& at_, const std::optional<at::Tensor>& bias,
                       int64_t B, int64_t d, int64_t Q, int64_t T) {
  const int64_t m = at_.size(0), alpha = at_.size(1);
  check_wino(m, alpha, "wino_output");
  TORCH_CHECK(at_.scalar_type() == at::kFloat, "wino_output: at must be float32");
  TORCH_CHECK((int64_t)M.size() == alpha, "wino_output: ", alpha, " products wanted, got ", M.size());
  TORCH_CHECK(T >= 0 && T <= Q * m * d, "wino_output: ", T, " outputs from ", Q, " tiles");
  const int64_t C = M[0].dim() == 2 ? M[0].size(1) : -1;
  std::vector<const float*> parts;
  for (const auto& t : M) {
    TORCH_CHECK(t.dim() == 2 && t.scalar_type() == at::kFloat && t.is_contiguous() && t.size(0) == B * Q * d &&
                t.size(1) == C, "wino_output: products must be contiguous float32 (B * Q * d, C), got ", t.sizes());
    parts.push_back(t.data_ptr<float>());
  }
  at::Tensor atc = at_.contiguous();
  at::Tensor bc;
  if (bias.has_value() && bias->defined()) {
    bc = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(bc.numel() == C, "wino_output: bias of ", bc.numel(), " for ", C, " channels");
  }
  at::Tensor y = at::empty({B, T, C}, M[0].options());
  if (y.numel() == 0) return y;
  auto run = wino_output_for(alpha);
  run(parts.data(), atc.data_ptr<float>(), m, bc.defined() ? bc.data_ptr<float>() : nullptr, y.data_ptr<float>(), B, C,
      T, d, Q);
  return y;
}

// y[b][before + j][i] = x[b][i][j] (float32; rows of y before `before` and after S + before zero): the
// layout change around Winograd's channels-last transforms. torch's strided copy moved ~6-14 GB/s
// here; this one transposes 16 x 16 blocks in registers (AVX-512; a plain loop elsewhere).
#if defined(__AVX512F__)
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  // Within each 128-bit lane the 4 x 4 blocks are now transposed: r[4q + i] holds row i of the
  // transposed blocks of rows 4q..4q+3. Two rounds of 128-bit shuffles move the blocks into place.
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xDD);
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
    r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xDD);
  }
}
#endif

void transpose_rows(const float* x, float* y, int64_t B, int64_t R, int64_t S, int64_t before, int64_t after) {
  const int64_t out_rows = S + before + after, bs = (S + 15) / 16;
  at::parallel_for(0, B * bs, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t b = k / bs, j0 = (k % bs) * 16, nj = std::min<int64_t>(16, S - j0);
      const float* xb = x + b * R * S;
      float* yb = y + (b * out_rows + before) * R;
      if (k % bs == 0 && before) std::memset(y + b * out_rows * R, 0, before * R * sizeof(float));
      if (k % bs == bs - 1 && after) std::memset(yb + S * R, 0, after * R * sizeof(float));
      int64_t i0 = 0;
#if defined(__AVX512F__)
      const __mmask16 cols = first_lanes(nj);
      for (; i0 + 16 <= R; i0 += 16) {
        __m512 r[16];
        for (int i = 0; i < 16; ++i) r[i] = _mm512_maskz_loadu_ps(cols, xb + (i0 + i) * S + j0);
        transpose16(r);
        for (int j = 0; j < nj; ++j) _mm512_storeu_ps(yb + (j0 + j) * R + i0, r[j]);
      }
#endif
      for (int64_t j = j0; j < j0 + nj; ++j)
        for (int64_t i = i0; i < R; ++i) yb[j * R + i] = xb[i * S + j];
    }
  });
}

// x (B, R, S) float32 -> y (B, before + S + after, R) contiguous.
at::Tensor transpose_pad(const at::Tensor& x, int64_t before, int64_t after) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat, "transpose_pad: x must be float32 (B, R, S), got ",
              x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(before >= 0 && after >= 0, "transpose_pad: negative padding ", before, ", ", after);
  at::Tensor xc = x.contiguous();
  const int64_t B = x.size(0), R = x.size(1), S = x.size(2);
  at::Tensor y = at::empty({B, S + before + after, R}, x.options());
  if (S == 0) return y.zero_();
  if (y.numel() > 0) transpose_rows(xc.data_ptr<float>(), y.data_ptr<float>(), B, R, S, before, after);
  return y;
}

// Whether this build's float32 Winograd transforms and SnakeBeta are vectorised (AVX-512): the
// transforms are worth their passes only so, and the float32 snake exists only so.
bool vectorised_float32() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

// Whether bfloat16 linears run on AMX (built for it, granted by the OS, not turned off by OMNITTS_AMX=0).
bool amx() {
#if defined(OMNITTS_HAVE_AMX)
  return amx_enabled();
#else
  return false;
#endif
}

// Which dtypes this build has kernels for: bit 0 float32, bit 1 bfloat16.
int64_t dtypes() {
  int64_t bits = 0;
#if defined(OMNITTS_HAVE_F32)
  bits |= 1;
#endif
#if defined(OMNITTS_HAVE_BF16)
  bits |= 2;
#endif
  return bits;
}

}  // namespace

TORCH_LIBRARY(omnitts, m) {
  m.def("pack_linear(Tensor weight, ScalarType dtype, Tensor? out=None) -> Tensor", &pack_linear);
  m.def("linear(Tensor x, Tensor packed, int out_features, Tensor? bias, bool amx=True) -> Tensor", &linear);
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &rms_norm);
  m.def("norm_rope(Tensor x, Tensor weight, float eps, Tensor cos, Tensor sin) -> Tensor", &norm_rope);
  m.def("snake(Tensor x, Tensor alpha, Tensor inv_beta) -> Tensor", &snake);
  m.def("silu_mul(Tensor x) -> Tensor", &silu_mul);
  m.def("snake_channels_last(Tensor x, Tensor alpha, Tensor inv_beta) -> Tensor", &snake_channels_last);
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale) -> Tensor", &decode_attention);
  m.def("wino_input(Tensor x, Tensor bt, int m, int d, int Q) -> Tensor", &wino_input);
  m.def("wino_output(Tensor[] M, Tensor at, Tensor? bias, int B, int d, int Q, int T) -> Tensor", &wino_output);
  m.def("vectorised_float32() -> bool", &vectorised_float32);
  m.def("transpose_pad(Tensor x, int before=0, int after=0) -> Tensor", &transpose_pad);
  m.def("dtypes() -> int", &dtypes);
  m.def("amx() -> bool", &amx);
}
