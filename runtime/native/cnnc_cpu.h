// cnnc_cpu.h — the CPU target's kernel library (runtime/native; codegen/cpu instantiates it).
//
// The generated translation unit (native.Wrap) includes this header three times: once plain, for
// the ABI shared with runtime/native (the kernel table), then inside two namespaces with
// CNNC_VW defined — the baseline (SSE2, 4 floats a vector) and, under
// `#pragma GCC target("avx2,fma")`, AVX2 with FMA (8 floats) — each followed by the model's
// kernels, so one binary runs on any x86-64 and the device picks the AVX2 table where the CPU has
// it. Kernels are C++ templates over a geometry struct of compile-time constants (shapes, flags,
// the task decomposition) that codegen/cpu writes per kernel; vectors are GCC vector extensions,
// so the same text compiles for both widths (and elsewhere, for the baseline's width).
//
// A kernel is `static void run(const uint64_t* params, int64_t task, float* scratch)` plus its
// task count and the per-worker scratch it needs. A launch runs tasks 0..tasks-1 on the device's
// workers in any order and on any thread: every task writes its own outputs (argmax words two
// tasks share are updated with atomic and/or of the task's own bits), and every reduction runs in
// a fixed order inside one task (weight gradients: per-task partial sums in the plan's workspace,
// added in task order by a second kernel), so results do not depend on the number of threads or
// on scheduling. No float atomics, no allocation: scratch is the worker's, sized by the table.
#ifndef CNNC_CPU_H_ABI
#define CNNC_CPU_H_ABI
// The ABI part is C as well: runtime/native's cgo code reads the kernel table through it.
#include <stdint.h>
#ifdef __cplusplus
#include <cmath>
#include <cstring>
#include <utility>
extern "C" {
#endif

#define CNNC_CPU_ABI 3

// The step's scalar block (runtime/device.StepScalars, the CUDA kernels' CnncStepScalars): kernels
// that need the learning rate, step, seed or valid count take a pointer to it, which never
// changes; the trainer fills the block before each step.
typedef struct CnncStepScalars {
  int64_t step;   // 0-based training step
  uint64_t seed;  // the run's seed (dropout)
  int64_t valid;  // samples of the batch that are real (a partial batch is padded)
  float lr;       // learning rate
  int32_t pad;
} CnncStepScalars;
#ifdef __cplusplus
static_assert(sizeof(CnncStepScalars) == 32, "CnncStepScalars is runtime/device.StepScalars: 32 bytes");
#endif

typedef void (*cnnc_cpu_task_fn)(const uint64_t* params, int64_t task, float* scratch);
// One kernel compiled for one instruction set: its entry, the scratch bytes it needs per worker,
// its task count.
typedef struct cnnc_cpu_kernel_impl {
  cnnc_cpu_task_fn fn;
  int64_t scratch_bytes;
  int64_t tasks;
} cnnc_cpu_kernel_impl;
// A model's kernel library: per kernel its name and parameter count, and its implementation for
// the baseline (impl[0], SSE2) and for AVX2+FMA (impl[1]), each compiled in a translation unit of
// its own (runtime/native's wrap).
typedef struct cnnc_cpu_library {
  int32_t abi;                // CNNC_CPU_ABI
  const char* source_sha256;  // hex SHA-256 of the model's kernel source
  int32_t nkernels;
  const char* const* names;
  const int32_t* nparams;
  const cnnc_cpu_kernel_impl* impl[2];
} cnnc_cpu_library;

#ifdef __cplusplus
}
// A kernel of the model's source: name is an implementation (a kernel template instantiated on
// its geometry) taking nparams parameters; native.Wrap builds the kernel table from these lines.
#define CNNC_CPU_KERNEL(name, nparams, ...) using name = __VA_ARGS__;
#endif
#endif  // CNNC_CPU_H_ABI

#ifdef CNNC_VW
// ---------------------------------------------------------------------------------------------
// Per-ISA part: everything below is compiled once per vector width, inside its namespace.

constexpr int VW = CNNC_VW;
typedef float vf __attribute__((vector_size(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4), __may_alias__));
typedef int vi __attribute__((vector_size(VW * 4)));
typedef int viu __attribute__((vector_size(VW * 4), aligned(4), __may_alias__));

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer (make test-asan) nothing is forced inline or unrolled: GCC's compile of
// the instrumented tiles, inlined and unrolled, took minutes a file even at -O1 (18 s without;
// BENCHMARKS.md), and ASan checks the same accesses either way.
#define CNNC_INLINE static inline
#define CNNC_MEMBER inline
#define CNNC_UNROLL
#else
#define CNNC_INLINE static inline __attribute__((always_inline))
#define CNNC_MEMBER inline __attribute__((always_inline))
// register tiles: small loops over a tile's rows and vectors, unrolled so that the tile lives in
// registers (at -O2 too)
#define CNNC_UNROLL _Pragma("GCC unroll 16")
#endif

CNNC_INLINE vf vload(const float* p) { return *reinterpret_cast<const vfu*>(p); }
CNNC_INLINE void vstore(float* p, vf v) { *reinterpret_cast<vfu*>(p) = v; }
CNNC_INLINE vf vbcast(float s) {
  vf r;  // not vf{} + s: adding +0 is no identity for -0, so the add would stay in the loop
  CNNC_UNROLL
  for (int i = 0; i < VW; i++) r[i] = s;
  return r;
}
CNNC_INLINE vf vzero() { return vf{}; }
CNNC_INLINE vf vrelu(vf v) { return v > vf{} ? v : vf{}; }
// the lanes' sum, in lane order: a fixed order, so a task's sums are the same on every run
CNNC_INLINE float hsum(vf v) {
  float s = v[0];
  CNNC_UNROLL
  for (int i = 1; i < VW; i++) s += v[i];
  return s;
}
CNNC_INLINE vf vsqrt(vf v) {
  vf r;
  CNNC_UNROLL
  for (int i = 0; i < VW; i++) r[i] = sqrtf(v[i]);
  return r;
}
CNNC_INLINE float vsqrt(float v) { return sqrtf(v); }
// d where y > 0, else 0 (a ReLU's mask). Both values are loaded by the caller, unconditionally: GCC
// 12's basic-block vectorizer turned `y > 0 ? d[i] : 0` (a conditional load) into wrong code for
// AVX2 in short constant-length loops.
CNNC_INLINE float masked(float y, float d) { return y > 0.0f ? d : 0.0f; }

template <class T>
CNNC_INLINE T* arg(const uint64_t* p, int i) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p[i]));
}
CNNC_INLINE long argi(const uint64_t* p, int i) { return static_cast<long>(static_cast<int64_t>(p[i])); }
// the step's scalar block that parameter i points to
CNNC_INLINE const CnncStepScalars& argscalars(const uint64_t* p, int i) { return *arg<const CnncStepScalars>(p, i); }

constexpr long cdiv(long a, long b) { return (a + b - 1) / b; }
constexpr long rup(long a, long b) { return cdiv(a, b) * b; }
constexpr long cmin(long a, long b) { return a < b ? a : b; }
constexpr long cmax(long a, long b) { return a > b ? a : b; }
// floor(a / b) for b > 0, a of either sign
constexpr long fdiv(long a, long b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
// the bytes of n floats rounded up to 64 (scratch areas are cut at cache-line boundaries)
constexpr long floats64(long n) { return rup(n * 4, 64); }

// run f<I>() for I = 0..N-1, I a compile-time constant
template <int... I, class F>
CNNC_INLINE void static_for_(std::integer_sequence<int, I...>, F&& f) {
  (f.template operator()<I>(), ...);
}
template <int N, class F>
CNNC_INLINE void static_for(F&& f) {
  static_for_(std::make_integer_sequence<int, N>{}, f);
}
// call f.template operator()<T1>() or <T2>() for the runtime r, which is one of the compile-time
// tails T1, T2 of a loop in steps of a micro-tile (0: no tail of that kind)
template <int T1, int T2, class F>
CNNC_INLINE void dispatch_tail2(long r, F&& f) {
  if constexpr (T1 > 0) {
    if (r == T1) {
      f.template operator()<T1>();
      return;
    }
  }
  if constexpr (T2 > 0 && T2 != T1) {
    if (r == T2) f.template operator()<T2>();
  }
}

// Packed argmax (codegen/argmax.go): element e's window index in BITS bits of word e / (32/BITS).
// put_argmax writes the fields of elements [start, start+n), code(i) giving element start+i's; a
// word holding elements of another task (or padding past the tensor's last element, which only
// the task owning the word's start writes) is updated with atomic and/or of this task's fields,
// so every word ends the same whatever the tasks' order.
template <int BITS, class F>
CNNC_INLINE void put_argmax(uint32_t* am, long start, long n, long total, F code) {
  constexpr long PER = 32 / BITS;
  constexpr uint32_t MASK = BITS == 32 ? ~0u : (1u << BITS) - 1u;
  const long end = start + n;
  for (long e = start; e < end;) {
    const long wd = e / PER, wlo = wd * PER, whi = wlo + PER;
    const long hi = whi < end ? whi : end;
    uint32_t bits = 0, field = 0;
    for (long i = e; i < hi; i++) {
      const int sh = static_cast<int>(i - wlo) * BITS;
      bits |= (static_cast<uint32_t>(code(i - start)) & MASK) << sh;
      field |= MASK << sh;
    }
    if (e == wlo && (hi == whi || hi == total)) {
      am[wd] = bits;
    } else {
      __atomic_fetch_and(&am[wd], ~field, __ATOMIC_RELAXED);
      __atomic_fetch_or(&am[wd], bits, __ATOMIC_RELAXED);
    }
    e = hi;
  }
}
template <int BITS>
CNNC_INLINE int get_argmax(const uint32_t* am, long e) {
  constexpr long PER = 32 / BITS;
  constexpr uint32_t MASK = BITS == 32 ? ~0u : (1u << BITS) - 1u;
  return static_cast<int>((am[e / PER] >> ((e % PER) * BITS)) & MASK);
}

// ---------------------------------------------------------------------------------------------
// Optimizer updates, as torch.optim computes them (and templates/update.cu.tmpl): T is float or
// vf (a vector of consecutive elements). The struct O carries the compiled-in constants:
//   KIND 0 sgd, 1 adam, 2 adamw; WD, MOM, NESTEROV, B1, B2, OMB1 (1-B1), OMB2, EPS, B1D, B2D.

// x, rounded to float as computed: the compiler may not contract the product that gives it into an
// FMA. Adam's moments add two products, and which one the compiler contracts may depend on the
// code around (a fused update epilogue, a standalone update): rounding one of them leaves one
// choice, so every update of an element gives the same bits.
template <class T>
CNNC_INLINE T fp_rounded(T x) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__("" : "+x"(x));
#elif defined(__aarch64__)
  __asm__("" : "+w"(x));
#else
  volatile T v = x;
  x = v;
#endif
  return x;
}

template <class O>
struct OptRun {
  float lr;
  long step;
  float bc1, sbc2;  // Adam's bias corrections for t = step + 1, in double as torch computes them
  OptRun(float lr_, long step_) : lr(lr_), step(step_), bc1(1), sbc2(1) {
    if (O::KIND != 0) {
      bc1 = static_cast<float>(1.0 - pow(O::B1D, static_cast<double>(step + 1)));
      sbc2 = static_cast<float>(sqrt(1.0 - pow(O::B2D, static_cast<double>(step + 1))));
    }
  }
  // one update of parameter p (and its state s0, s1) with gradient g
  template <class T>
  CNNC_MEMBER void apply(T g, T& p, T& s0, T& s1) const {
    if constexpr (O::KIND != 0) {
      if constexpr (O::KIND == 2 && O::HAS_WD) {
        p *= 1.0f - lr * O::WD;  // AdamW: decoupled weight decay
      } else if constexpr (O::HAS_WD) {
        g += O::WD * p;  // Adam: L2 weight decay
      }
      const T expAvg = fp_rounded<T>(O::B1 * s0) + O::OMB1 * g;
      const T expAvgSq = fp_rounded<T>(O::B2 * s1) + O::OMB2 * g * g;
      s0 = expAvg;
      s1 = expAvgSq;
      p -= lr / bc1 * expAvg / (vsqrt(expAvgSq) / sbc2 + O::EPS);
    } else {
      if constexpr (O::HAS_WD) g += O::WD * p;  // L2 weight decay
      if constexpr (O::HAS_MOM) {
        const T buf = step == 0 ? g : O::MOM * s0 + g;  // the first step's buffer is the gradient
        s0 = buf;
        if constexpr (O::NESTEROV) {
          g += O::MOM * buf;
        } else {
          g = buf;
        }
      }
      p -= lr * g;
    }
  }
};

// The parameter pointers of a fused or standalone update: p, then its NS states.
template <class O>
constexpr int opt_states() {
  return O::KIND != 0 ? 2 : (O::HAS_MOM ? 1 : 0);
}

// Applies the update to n consecutive elements from index at: gradients g[0..n), parameter
// p + at, states s0 + at, s1 + at (unused ones may be null).
template <class O>
CNNC_INLINE void opt_range(const OptRun<O>& run, const float* g, float* p, float* s0, float* s1, long n) {
  long i = 0;
  for (; i + VW <= n; i += VW) {
    vf gv = vload(g + i), pv = vload(p + i);
    vf a = s0 ? vload(s0 + i) : vzero(), b = s1 ? vload(s1 + i) : vzero();
    run.apply(gv, pv, a, b);
    vstore(p + i, pv);
    if (s0) vstore(s0 + i, a);
    if (s1) vstore(s1 + i, b);
  }
  for (; i < n; i++) {
    float pv = p[i], a = s0 ? s0[i] : 0.0f, b = s1 ? s1[i] : 0.0f;
    run.apply(g[i], pv, a, b);
    p[i] = pv;
    if (s0) s0[i] = a;
    if (s1) s1[i] = b;
  }
}

// Philox4x32-10, word 0 (templates/dropout.cu.tmpl, reference.DropoutKeep).
CNNC_INLINE uint32_t philox_word0(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; round++) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0, p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

// ---------------------------------------------------------------------------------------------
// The data block's augmentation (compiler/augment), applied while the first layer loads the raw
// u8 HWC batch. A sample's draw folds every geometric step into one box of the raw image (pixels
// outside it are 0: random_crop's padding) and a mirror flag; a box of the output's size is read
// pixel for pixel, another is resized bilinearly (torch's upsample_bilinear2d, align_corners=False,
// no antialias). Training draws from Philox keyed by (seed, step, the sample's position in the
// step's batch) exactly as augment.Spec.Draw with ops.AugmentWord; evaluation reads the constant
// center box. The struct A (kernel constants) has:
//   TRAIN, RH, RW, C (raw image), OH, OW (the model's input), CROP (0 none, 1 random_crop,
//   2 random_resized_crop), CROPK (its step index; -1 none), PAD, SCALE0, SCALE1, LR0, LR1 (log
//   ratio bounds), FTOP, FLEFT, FH, FW (its fallback box), FLIPK (-1 none), FLIPT (p as a fraction of 2^32), ETOP, ELEFT, EH,
//   EW (evaluation's box), NORM, M0..M2, S0..S2 (mean, std).
struct AugBox {
  long top, left, h, w;
  bool flip;
};
constexpr uint32_t AUG_KEY = 0x41554731u;  // ops.AugmentKey
constexpr uint32_t AUG_WORDS_PER_STEP = 24;  // augment.WordsPerStep
CNNC_INLINE uint32_t aug_word(const CnncStepScalars& sc, long pos, uint32_t d) {
  const uint64_t step = static_cast<uint64_t>(sc.step);
  return philox_word0(static_cast<uint32_t>(pos), static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32), d,
                      static_cast<uint32_t>(sc.seed), static_cast<uint32_t>(sc.seed >> 32) ^ AUG_KEY);
}
// torchvision's uniform_(a, b) from a word, in double; the product is kept apart from the sum
// (volatile) so that no FMA contraction makes it differ from the Go draw.
CNNC_INLINE double aug_uniform(uint32_t w, double a, double b) {
  volatile double t = static_cast<double>(w >> 8) * (1.0 / 16777216.0) * (b - a);
  return a + t;
}
CNNC_INLINE long aug_below(uint32_t w, long n) { return static_cast<long>((static_cast<uint64_t>(w) * static_cast<uint64_t>(n)) >> 32); }

template <class A>
CNNC_INLINE AugBox aug_box(const CnncStepScalars* sc, long pos) {
  if constexpr (!A::TRAIN) {
    return AugBox{A::ETOP, A::ELEFT, A::EH, A::EW, false};
  } else {
    AugBox p{0, 0, A::RH, A::RW, false};
    bool flip = false;
    if constexpr (A::FLIPK >= 0) flip = aug_word(*sc, pos, A::FLIPK * AUG_WORDS_PER_STEP) < A::FLIPT;
    if constexpr (A::CROP == 1) {
      uint32_t d = A::CROPK * AUG_WORDS_PER_STEP;
      const long i = aug_below(aug_word(*sc, pos, d), A::RH + 2 * A::PAD - A::OH + 1);
      const long j = aug_below(aug_word(*sc, pos, d + 1), A::RW + 2 * A::PAD - A::OW + 1);
      p = AugBox{i - A::PAD, j - A::PAD, A::OH, A::OW, false};
    } else if constexpr (A::CROP == 2) {
      uint32_t d = A::CROPK * AUG_WORDS_PER_STEP;
      const double area = static_cast<double>(A::RH * A::RW);
      bool found = false;
      for (int t = 0; t < 10 && !found; t++) {
        const double target = area * aug_uniform(aug_word(*sc, pos, d), A::SCALE0, A::SCALE1);
        const double aspect = exp(aug_uniform(aug_word(*sc, pos, d + 1), A::LR0, A::LR1));
        d += 2;
        const long cw = lrint(sqrt(target * aspect)), ch = lrint(sqrt(target / aspect));
        if (0 < cw && cw <= A::RW && 0 < ch && ch <= A::RH) {
          const long i = aug_below(aug_word(*sc, pos, d), A::RH - ch + 1), j = aug_below(aug_word(*sc, pos, d + 1), A::RW - cw + 1);
          p = AugBox{i, j, ch, cw, false};
          found = true;
        }
      }
      if (!found) p = AugBox{A::FTOP, A::FLEFT, A::FH, A::FW, false};  // the ratio-clamped central crop
    }
    // a flip before the crop mirrors the box (augment.foldCrop)
    if constexpr (A::CROP != 0 && A::FLIPK >= 0 && A::FLIPK < A::CROPK)
      if (flip) p.left = A::RW - p.left - p.w;
    p.flip = flip;
    return p;
  }
}

// The raw pixel (c, ry, rx) of sample src in [0,1], 0 outside the image.
template <class A>
CNNC_INLINE float aug_raw(const unsigned char* src, long c, long ry, long rx) {
  if (ry < 0 || ry >= A::RH || rx < 0 || rx >= A::RW) return 0.0f;
  return static_cast<float>(src[(ry * A::RW + rx) * A::C + c]) * (1.0f / 255.0f);
}

// The model's input (c, y, x) of sample src under box p: cropped, mirrored, resized, normalized.
template <class A>
CNNC_INLINE float aug_pixel(const unsigned char* src, const AugBox& p, long c, long y, long x) {
  const long xs = p.flip ? A::OW - 1 - x : x;
  float v;
  if (p.h == A::OH && p.w == A::OW) {
    v = aug_raw<A>(src, c, p.top + y, p.left + xs);
  } else {
    const float sy = fmaxf((static_cast<float>(y) + 0.5f) * (static_cast<float>(p.h) / static_cast<float>(A::OH)) - 0.5f, 0.0f);
    const float sx = fmaxf((static_cast<float>(xs) + 0.5f) * (static_cast<float>(p.w) / static_cast<float>(A::OW)) - 0.5f, 0.0f);
    const long y0 = static_cast<long>(sy), x0 = static_cast<long>(sx);
    const long y1 = cmin(y0 + 1, p.h - 1), x1 = cmin(x0 + 1, p.w - 1);
    const float ly = sy - static_cast<float>(y0), lx = sx - static_cast<float>(x0);
    const long ty = p.top, tx = p.left;
    v = (1.0f - ly) * ((1.0f - lx) * aug_raw<A>(src, c, ty + y0, tx + x0) + lx * aug_raw<A>(src, c, ty + y0, tx + x1)) +
        ly * ((1.0f - lx) * aug_raw<A>(src, c, ty + y1, tx + x0) + lx * aug_raw<A>(src, c, ty + y1, tx + x1));
  }
  if constexpr (A::NORM) {
    const float m = c == 0 ? A::M0 : c == 1 ? A::M1 : A::M2, sd = c == 0 ? A::S0 : c == 1 ? A::S1 : A::S2;
    v = (v - m) / sd;
  }
  return v;
}

// A conv geometry G that augments its image has a member struct G::A of augmentation constants.
template <class G>
concept Augments = requires { typename G::A; };

// Sample b's box in a kernel whose parameters from i on are (in training) the step's scalars and
// the first sample of the micro-batch the launch covers.
template <class G>
CNNC_INLINE AugBox aug_sample(const uint64_t* p, int i, long b) {
  using A = typename G::A;
  if constexpr (A::TRAIN) {
    return aug_box<A>(&argscalars(p, i), argi(p, i + 1) + b);
  } else {
    return aug_box<A>(nullptr, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// Convolution blocks (ir/fused.go). The geometry struct G has:
//   B, C, H, W, U8 (input u8 HWC images, /255 in the loads), O, KH, KW, SH, SW, PH, PW, HO, WO,
//   BIAS, RELU, POOL, PKH, PKW, PSH, PSW, PPH, PPW, PHO, PWO, BITS, HASY, MASKOUT,
//   ACT, SAVEZ (an activation F other than ReLU folded in, as the linear blocks': the forward
//   applies F::f before the pool and writes z too with SAVEZ — pooled, z at each pooled output's
//   argmax, a pooled-size tensor —; the gradients take F::g(dy, s), s the saved y or z (pooled:
//   at the argmax), HASY's input), and the decomposition: BAND (rows per task), OT (channels
//   per task), S (weight-gradient tasks).
struct NoActF;  // no activation (below, with the activation functors)

// Input tile: rows iyBase..iyBase+IR-1 of sample b, every channel, zero-padded, split by column
// phase (ix + PW) mod SW so that a stride-SW conv reads consecutive floats:
//   Xt[((c * IR + ir) * SW + ph) * JW + j] = x(b, c, iyBase + ir, j * SW + ph - PW)
template <class G, long IR, long JW>
CNNC_INLINE void fill_x(const void* xp, long b, long iyBase, float* Xt, const AugBox* box = nullptr) {
  if constexpr (Augments<G>) {
    // the model's input rows through the sample's box: a box of the output's size row by row
    // (the raw row, its columns mirrored when flipped, zeros outside the image, normalized),
    // a resized box pixel by pixel (aug_pixel)
    using A = typename G::A;
    const unsigned char* src = static_cast<const unsigned char*>(xp) + b * A::RH * A::RW * A::C;
    const AugBox& p = *box;
    if (p.h != A::OH || p.w != A::OW) {
      // resized (the box lies inside the image): each staged column's two taps and weight once,
      // each row's once, then per pixel aug_pixel's arithmetic on them
      long x0s[G::SW * JW], x1s[G::SW * JW];
      float lxs[G::SW * JW];
      for (long ph = 0; ph < G::SW; ph++)
        for (long j = 0; j < JW; j++) {
          const long ix = j * G::SW + ph - G::PW, e = ph * JW + j;
          if (ix < 0 || ix >= G::W) {
            x0s[e] = -1;  // the conv's own zero padding
            continue;
          }
          const long xs = p.flip ? A::OW - 1 - ix : ix;
          const float sx = fmaxf((static_cast<float>(xs) + 0.5f) * (static_cast<float>(p.w) / static_cast<float>(A::OW)) - 0.5f, 0.0f);
          const long x0 = static_cast<long>(sx);
          x0s[e] = (p.left + x0) * A::C;
          x1s[e] = (p.left + cmin(x0 + 1, p.w - 1)) * A::C;
          lxs[e] = sx - static_cast<float>(x0);
        }
      for (long ir = 0; ir < IR; ir++) {
        const long iy = iyBase + ir;
        if (iy < 0 || iy >= G::H) {
          for (long c = 0; c < G::C; c++) memset(Xt + (c * IR + ir) * G::SW * JW, 0, sizeof(float) * G::SW * JW);
          continue;
        }
        const float sy = fmaxf((static_cast<float>(iy) + 0.5f) * (static_cast<float>(p.h) / static_cast<float>(A::OH)) - 0.5f, 0.0f);
        const long y0 = static_cast<long>(sy), y1 = cmin(y0 + 1, p.h - 1);
        const float ly = sy - static_cast<float>(y0);
        for (long c = 0; c < G::C; c++) {
          const float m = A::NORM ? (c == 0 ? A::M0 : c == 1 ? A::M1 : A::M2) : 0.0f;
          const float sd = A::NORM ? (c == 0 ? A::S0 : c == 1 ? A::S1 : A::S2) : 1.0f;
          const unsigned char* r0 = src + (p.top + y0) * A::RW * A::C + c;
          const unsigned char* r1 = src + (p.top + y1) * A::RW * A::C + c;
          for (long ph = 0; ph < G::SW; ph++) {
            float* row = Xt + ((c * IR + ir) * G::SW + ph) * JW;
            for (long j = 0; j < JW; j++) {
              const long e = ph * JW + j, a = x0s[e];
              if (a < 0) {
                row[j] = 0.0f;
                continue;
              }
              const long bb = x1s[e];
              const float lx = lxs[e], k = 1.0f / 255.0f;
              float v = (1.0f - ly) * ((1.0f - lx) * (static_cast<float>(r0[a]) * k) + lx * (static_cast<float>(r0[bb]) * k)) +
                        ly * ((1.0f - lx) * (static_cast<float>(r1[a]) * k) + lx * (static_cast<float>(r1[bb]) * k));
              if constexpr (A::NORM) v = (v - m) / sd;
              row[j] = v;
            }
          }
        }
      }
      return;
    }
    // a box of the output's size: each staged column's raw column, once (-1: outside the raw
    // image, a zero pixel that is normalized; -2: the conv's own zero padding)
    long cols[G::SW * JW];
    for (long ph = 0; ph < G::SW; ph++)
      for (long j = 0; j < JW; j++) {
        const long ix = j * G::SW + ph - G::PW;
        const long rx = p.left + (p.flip ? A::OW - 1 - ix : ix);
        cols[ph * JW + j] = ix < 0 || ix >= G::W ? -2 : rx < 0 || rx >= A::RW ? -1 : rx * A::C;
      }
    for (long ir = 0; ir < IR; ir++) {
      const long iy = iyBase + ir;
      const long ry = p.top + iy;
      const bool rowIn = ry >= 0 && ry < A::RH;
      for (long c = 0; c < G::C; c++) {
        const float m = A::NORM ? (c == 0 ? A::M0 : c == 1 ? A::M1 : A::M2) : 0.0f;
        const float sd = A::NORM ? (c == 0 ? A::S0 : c == 1 ? A::S1 : A::S2) : 1.0f;
        const unsigned char* srow = src + (rowIn ? ry : 0) * A::RW * A::C + c;
        for (long ph = 0; ph < G::SW; ph++) {
          float* row = Xt + ((c * IR + ir) * G::SW + ph) * JW;
          if (iy < 0 || iy >= G::H) {
            memset(row, 0, sizeof(float) * JW);  // the conv's own zero padding
            continue;
          }
          const long* cl = cols + ph * JW;
          for (long j = 0; j < JW; j++) {
            const long k = cl[j];
            float v = rowIn && k >= 0 ? static_cast<float>(srow[k]) * (1.0f / 255.0f) : 0.0f;
            if constexpr (A::NORM) v = (v - m) / sd;
            row[j] = k == -2 ? 0.0f : v;
          }
        }
      }
    }
    return;
  } else if constexpr (G::U8) {
    for (long ir = 0; ir < IR; ir++) {
      const long iy = iyBase + ir;
      if (iy < 0 || iy >= G::H) {
        for (long c = 0; c < G::C; c++) memset(Xt + (c * IR + ir) * G::SW * JW, 0, sizeof(float) * G::SW * JW);
        continue;
      }
      const unsigned char* src = static_cast<const unsigned char*>(xp) + (b * G::H + iy) * G::W * G::C;
      for (long ph = 0; ph < G::SW; ph++) {
        // j = (ix + PW - ph) / SW for the columns ix of this phase
        const long jA = cmin(JW, cdiv(cmax(0, G::PW - ph), G::SW)), jB = cmax(jA, cmin(JW, cdiv(G::W + G::PW - ph, G::SW)));
        for (long c = 0; c < G::C; c++) {
          float* row = Xt + ((c * IR + ir) * G::SW + ph) * JW;
          for (long j = 0; j < jA; j++) row[j] = 0.0f;
          for (long j = jB; j < JW; j++) row[j] = 0.0f;
        }
        for (long j = jA; j < jB; j++) {
          const unsigned char* px = src + (j * G::SW + ph - G::PW) * G::C;
          for (long c = 0; c < G::C; c++) Xt[((c * IR + ir) * G::SW + ph) * JW + j] = static_cast<float>(px[c]) * (1.0f / 255.0f);
        }
      }
    }
    return;
  }
  for (long c = 0; c < G::C; c++)
    for (long ir = 0; ir < IR; ir++) {
      const long iy = iyBase + ir;
      float* row = Xt + (c * IR + ir) * G::SW * JW;
      if (iy < 0 || iy >= G::H) {
        memset(row, 0, sizeof(float) * G::SW * JW);
        continue;
      }
      const float* src = static_cast<const float*>(xp) + ((b * G::C + c) * G::H + iy) * G::W;
      if constexpr (G::SW == 1) {
        // j = ix + PW: [zeros | the row | zeros]
        const long lo = G::PW < JW ? G::PW : JW;
        const long n = cmin(G::W, JW - lo);
        memset(row, 0, sizeof(float) * lo);
        memcpy(row + lo, src, sizeof(float) * n);
        memset(row + lo + n, 0, sizeof(float) * (JW - lo - n));
      } else {
        for (long ph = 0; ph < G::SW; ph++)
          for (long j = 0; j < JW; j++) {
            const long ix = j * G::SW + ph - G::PW;
            row[ph * JW + j] = ix >= 0 && ix < G::W ? src[ix] : 0.0f;
          }
      }
    }
}

// The conv output's gradient dy(b, o, oy, ox) for oy = oyLo + r (r < DR), o = o0 + i (i < no),
// ox < DW - QL, into Dt[(i * DR + r) * DW + QL + ox], zero elsewhere: from dout at the block's output resolution,
// masked by the saved output y > 0 (HASY) or times F's derivative (ACT), routed through the packed argmax (POOL) — each pooled
// gradient lands on its window's maximum; sums over overlapping windows in window scan order.
template <class G, class F = NoActF>
CNNC_INLINE void form_dy(const float* dout, const uint32_t* am, const float* yout, long b, long o0, long no, long oyLo, long DR,
                         long DW, long QL, float* Dt) {
  memset(Dt, 0, sizeof(float) * no * DR * DW);
  if constexpr (!G::POOL) {
    for (long i = 0; i < no; i++)
      for (long r = 0; r < DR; r++) {
        const long oy = oyLo + r;
        if (oy < 0 || oy >= G::HO) continue;
        const long pe = ((b * G::O + o0 + i) * G::HO + oy) * G::WO;
        float* dst = Dt + (i * DR + r) * DW + QL;
        for (long ox = 0; ox < cmin(G::WO, DW - QL); ox++) {
          if constexpr (G::ACT) {
            dst[ox] = F::g(dout[pe + ox], yout[pe + ox]);
          } else if constexpr (G::HASY) {
            dst[ox] = masked(yout[pe + ox], dout[pe + ox]);
          } else {
            dst[ox] = dout[pe + ox];
          }
        }
      }
  } else {
    // pooled rows whose windows reach conv rows [oyLo, oyLo + DR)
    const long pyA = cmax(0, fdiv(oyLo + G::PPH - G::PKH, G::PSH) + 1);
    const long pyB = cmin(G::PHO - 1, fdiv(oyLo + DR - 1 + G::PPH, G::PSH));
    for (long i = 0; i < no; i++)
      for (long py = pyA; py <= pyB; py++) {
        const long pe0 = ((b * G::O + o0 + i) * G::PHO + py) * G::PWO;
        for (long px = 0; px < G::PWO; px++) {
          const long pe = pe0 + px;
          const int k = get_argmax<G::BITS>(am, pe);
          const long cy = py * G::PSH - G::PPH + k / G::PKW, cx = px * G::PSW - G::PPW + k % G::PKW;
          if (cy < oyLo || cy >= oyLo + DR || cy < 0 || cy >= G::HO || cx < 0 || cx >= G::WO || QL + cx >= DW || k >= G::PKH * G::PKW) continue;
          float v = dout[pe];
          if constexpr (G::ACT) {
            v = F::g(v, yout[pe]);
          } else if constexpr (G::HASY) {
            v = masked(yout[pe], v);
          }
          Dt[(i * DR + cy - oyLo) * DW + QL + cx] += v;
        }
      }
  }
}

// n floats from p, PSW apart (a pooling window's column over consecutive pooled outputs)
template <int STRIDE>
CNNC_INLINE vf vgather(const float* p) {
  if constexpr (STRIDE == 1) {
    return vload(p);
  } else if constexpr (STRIDE == 2) {
#if CNNC_VW == 8
    return __builtin_shuffle(vload(p), vload(p + VW), vi{0, 2, 4, 6, 8, 10, 12, 14});
#else
    return __builtin_shuffle(vload(p), vload(p + VW), vi{0, 2, 4, 6});
#endif
  } else {
    vf r;
    CNNC_UNROLL
    for (int l = 0; l < VW; l++) r[l] = p[l * STRIDE];
    return r;
  }
}

// Max-pool of one pooled row py over conv rows held WOP apart from conv row cyStart (ct): the
// maximum of each window's positions inside the conv output and its index (ky·PKW + kx), the first
// maximum in scan order, as PyTorch; into yrow and codes. Windows that lie inside the conv
// output's columns run VW at a time.
template <class G, long WOP>
CNNC_INLINE void pool_row(const float* ct, long cyStart, long py, float* yrow, int* codes) {
  const long cy0 = py * G::PSH - G::PPH;
  const long kyA = cmax(0, -cy0), kyB = cmin(G::PKH, G::HO - cy0);
  auto scalar = [&](long px) {
    float best = 0.0f;
    int bestK = -1;
    for (long ky = kyA; ky < kyB; ky++) {
      const float* crow = ct + (cy0 + ky - cyStart) * WOP;
      for (int kx = 0; kx < G::PKW; kx++) {
        const long cx = px * G::PSW - G::PPW + kx;
        if (cx < 0 || cx >= G::WO) continue;  // padding: not a candidate
        const float v = crow[cx];
        if (bestK < 0 || v > best) {
          best = v;
          bestK = static_cast<int>(ky) * G::PKW + kx;
        }
      }
    }
    yrow[px] = best;
    codes[px] = bestK < 0 ? 0 : bestK;
  };
  // pooled columns whose window lies inside [0, WO)
  const long pxA = cmin(G::PWO, cdiv(G::PPW, G::PSW)), pxB = cmax(pxA, cmin(G::PWO, (G::WO - G::PKW + G::PPW) / G::PSW + 1));
  long px = 0;
  for (; px < pxA; px++) scalar(px);
  if (kyA < kyB) {
    for (; px + VW <= pxB; px += VW) {
      vf best = vzero();
      vi code = vi{};
      for (long ky = kyA; ky < kyB; ky++) {
        const float* crow = ct + (cy0 + ky - cyStart) * WOP + px * G::PSW - G::PPW;
        for (int kx = 0; kx < G::PKW; kx++) {
          const vf v = vgather<G::PSW>(crow + kx);
          const int k = static_cast<int>(ky) * G::PKW + kx;
          if (ky == kyA && kx == 0) {
            best = v;
            code = vi{} + k;
          } else {
            const vi m = v > best;
            best = m ? v : best;
            code = m ? vi{} + k : code;
          }
        }
      }
      vstore(yrow + px, best);
      *reinterpret_cast<viu*>(codes + px) = code;
    }
  }
  for (; px < G::PWO; px++) scalar(px);
}

// conv_block forward: conv + bias + ReLU + max-pool with packed argmax (ARGMAX; an inference
// block keeps none). A task is (sample,
// band of BAND output rows — pooled rows when pooled —, OT output channels): it stages the input
// rows it reads (fill_x), computes the conv rows under its band in MO x (NV vectors) register
// tiles — vectors across output columns, every tap a broadcast weight times a contiguous load —
// and writes the block's output: pooled, with the window's first maximum in scan order.
template <class G, class F = NoActF>
struct ConvFwd {
  // a map at most a vector wide (ResNet's 4x4 stage) takes one vector a row and twice the
  // channels a tile: 2 vectors would be three quarters padding there (the sums are the same)
  static constexpr int NV = G::WO <= VW ? 1 : 2, MO = 8 / NV;
  static constexpr long WOP = rup(G::WO, NV * VW);
  static constexpr long JW = WOP + (G::KW - 1) / G::SW;
  static constexpr long ROWS = G::POOL ? G::PHO : G::HO;
  static constexpr long NBANDS = cdiv(ROWS, G::BAND), NOG = cdiv(G::O, G::OT);
  static constexpr long tasks = G::B * NBANDS * NOG;
  static constexpr long CR = G::POOL ? (G::BAND - 1) * G::PSH + G::PKH : G::BAND;  // conv rows of a band
  static constexpr long IR = (CR - 1) * G::SH + G::KH;                            // input rows they read
  static constexpr long K = G::C * G::KH * G::KW;
  // ZT: z beside f(z) (CT) for a pooled block that saves z at each pooled output's argmax (SAVEZ)
  static constexpr long XT = floats64(G::C * IR * G::SW * JW), CT = G::POOL ? floats64(G::OT * CR * WOP) : 0,
                        ZT = G::POOL && G::SAVEZ ? CT : 0, CODES = G::POOL ? floats64(G::BAND * G::PWO) : 0;
  static constexpr long scratch = XT + CT + ZT + CODES;

  // conv rows cy in [cyA, cyB) of output channels o0..o0+M-1 (tile row cy - cyStart)
  template <int M>
  CNNC_MEMBER static void rows(const float* Xt, const float* w, const float* bias, long o0, long oc, long cyStart, long cyA, long cyB,
                               float* Ct, float* y, float* z, long b) {
    const float* wo = w + o0 * K;
    for (long cy = cyA; cy < cyB; cy++) {
      const long t = cy - cyStart;
      for (long x0 = 0; x0 < WOP; x0 += NV * VW) {
        vf acc[M][NV];
        CNNC_UNROLL
        for (int m = 0; m < M; m++)
          CNNC_UNROLL
          for (int j = 0; j < NV; j++) acc[m][j] = vzero();
        for (long c = 0; c < G::C; c++)
          for (int ky = 0; ky < G::KH; ky++) {
            const float* xr = Xt + ((c * IR + t * G::SH + ky) * G::SW) * JW + x0;
            const float* wr = wo + (c * G::KH + ky) * G::KW;
            CNNC_UNROLL
            for (int kx = 0; kx < G::KW; kx++) {
              const float* xk = xr + (kx % G::SW) * JW + kx / G::SW;
              vf xv[NV];
              CNNC_UNROLL
              for (int j = 0; j < NV; j++) xv[j] = vload(xk + j * VW);
              CNNC_UNROLL
              for (int m = 0; m < M; m++) {
                const vf wv = vbcast(wr[m * K + kx]);
                CNNC_UNROLL
                for (int j = 0; j < NV; j++) acc[m][j] += wv * xv[j];
              }
            }
          }
        CNNC_UNROLL
        for (int m = 0; m < M; m++) {
          const vf bv = G::BIAS ? vbcast(bias[o0 + m]) : vzero();
          CNNC_UNROLL
          for (int j = 0; j < NV; j++) {
            vf v = acc[m][j];
            if constexpr (G::BIAS) v += bv;
            if constexpr (G::RELU) v = vrelu(v);
            const vf zv = v;
            if constexpr (G::ACT) {
              CNNC_UNROLL
              for (int l = 0; l < VW; l++) v[l] = F::f(v[l]);
            }
            const long ox = x0 + j * VW;
            if constexpr (G::POOL) {
              vstore(Ct + ((o0 - oc + m) * CR + t) * WOP + ox, v);
              if constexpr (G::SAVEZ) vstore(Ct + CT / 4 + ((o0 - oc + m) * CR + t) * WOP + ox, zv);  // Zt, after Ct
            } else {
              const long at = ((b * G::O + o0 + m) * G::HO + cy) * G::WO + ox;
              if (ox + VW <= G::WO) {
                vstore(y + at, v);
                if constexpr (G::SAVEZ) vstore(z + at, zv);
              } else {
                for (int l = 0; l < VW && ox + l < G::WO; l++) {
                  y[at + l] = v[l];
                  if constexpr (G::SAVEZ) z[at + l] = zv[l];
                }
              }
            }
          }
        }
      }
    }
  }

  // z at the argmax of pooled rows r0..r0+nr-1 of one channel (the codes pool_row left), from its conv rows' z held WOP
  // apart from conv row cyStart (zt); a window with no position inside the conv output (none pools so) gets 0
  CNNC_MEMBER static void pooled_z(const float* zt, long cyStart, long r0, long nr, const int* codes, float* zp) {
    for (long pr = 0; pr < nr; pr++)
      for (long px = 0; px < G::PWO; px++) {
        const int k = codes[pr * G::PWO + px];
        const long cy = (r0 + pr) * G::PSH - G::PPH + k / G::PKW, cx = px * G::PSW - G::PPW + k % G::PKW;
        zp[pr * G::PWO + px] = cy >= 0 && cy < G::HO && cx >= 0 && cx < G::WO ? zt[(cy - cyStart) * WOP + cx] : 0.0f;
      }
  }

  static void run(const uint64_t* p, int64_t task, float* s) {
    int a = 0;
    const void* x = arg<const void>(p, a++);
    const float* w = arg<const float>(p, a++);
    const float* bias = G::BIAS ? arg<const float>(p, a++) : nullptr;
    float* y = arg<float>(p, a++);
    float* z = G::SAVEZ ? arg<float>(p, a++) : nullptr;  // pooled: z at each pooled output's argmax
    uint32_t* am = G::ARGMAX ? arg<uint32_t>(p, a++) : nullptr;  // inference: none
    const long og = task % NOG, band = task / NOG % NBANDS, b = task / (NOG * NBANDS);
    AugBox box{};
    if constexpr (Augments<G>) box = aug_sample<G>(p, a, b);
    const long oc = og * G::OT, no = cmin(G::OT, G::O - oc);
    const long r0 = band * G::BAND, nr = cmin(G::BAND, ROWS - r0);
    const long cyStart = G::POOL ? r0 * G::PSH - G::PPH : r0;
    const long cyA = cmax(0, cyStart);
    const long cyB = G::POOL ? cmin(G::HO, (r0 + nr - 1) * G::PSH - G::PPH + G::PKH) : r0 + nr;
    float* Xt = s;
    float* Ct = s + XT / 4;
    fill_x<G, IR, JW>(x, b, cyStart * G::SH - G::PH, Xt, &box);
    long m0 = 0;
    for (; m0 + MO <= no; m0 += MO) rows<MO>(Xt, w, bias, oc + m0, oc, cyStart, cyA, cyB, Ct, y, z, b);
    if (m0 < no)
      dispatch_tail2<G::OT % MO, (G::O - (NOG - 1) * G::OT) % MO>(no - m0, [&]<int M>() { rows<M>(Xt, w, bias, oc + m0, oc, cyStart, cyA, cyB, Ct, y, z, b); });
    if constexpr (G::POOL) {
      int* codes = reinterpret_cast<int*>(s + (XT + CT + ZT) / 4);
      for (long i = 0; i < no; i++) {
        const long o = oc + i;
        float* yp = y + ((b * G::O + o) * G::PHO + r0) * G::PWO;
        for (long pr = 0; pr < nr; pr++) pool_row<G, WOP>(Ct + i * CR * WOP, cyStart, r0 + pr, yp + pr * G::PWO, codes + pr * G::PWO);
        if constexpr (G::SAVEZ) pooled_z(Ct + CT / 4 + i * CR * WOP, cyStart, r0, nr, codes, z + ((b * G::O + o) * G::PHO + r0) * G::PWO);
        if constexpr (G::ARGMAX)
          put_argmax<G::BITS>(am, ((b * G::O + o) * G::PHO + r0) * G::PWO, nr * G::PWO, G::B * G::O * G::PHO * G::PWO,
                              [&](long e) { return codes[e]; });
      }
    }
  }
};

// conv_block input gradient: dx(c, iy, ix) = sum over o, ky, kx of w(o, c, ky, kx)·dy(o, oy, ox) with
// iy = oy·SH - PH + ky, ix = ox·SW - PW + kx. A task is (sample, band of BAND input rows, CT input
// channels): it forms the band's dy once (form_dy) and, per stride phase (iy mod SH, ix mod SW) —
// whose pixels all use the same taps, so each phase is a dense stride-1 correlation — runs MC x (NV
// vectors) register tiles across the phase's columns. The maskout epilogue multiplies by
// xmask > 0 (dx may be xmask: each element is read before it is written, by the same task).
template <class G, class F = NoActF>
struct ConvDgrad {
  static constexpr int NV = cdiv(G::W, G::SW) <= VW ? 1 : 2, MC = 8 / NV;  // as ConvFwd's
  static constexpr long NBANDS = cdiv(G::H, G::BAND), NCG = cdiv(G::C, G::OT);
  static constexpr long tasks = G::B * NBANDS * NCG;
  static constexpr long KHP = cdiv(G::KH, G::SH), KWP = cdiv(G::KW, G::SW);
  static constexpr long VP = rup(cdiv(G::W, G::SW), NV * VW);  // a phase row's pixels, padded
  static constexpr long QL = KWP - 1;                            // dy tile column of ox = 0
  static constexpr long DW = QL + (G::SW - 1 + G::PW) / G::SW + VP;
  static constexpr long DR = G::BAND / G::SH + (G::SH - 1 + G::PH) / G::SH - G::PH / G::SH + KHP - 1;
  static constexpr long scratch = floats64(G::O * DR * DW);

  template <int PY, int PX, int M>
  CNNC_MEMBER static void phase_rows(const float* Dt, const float* w, const float* xmask, float* dx, long b, long c0, long iy0, long oyLo) {
    constexpr long ky0 = (PY + G::PH) % G::SH, kx0 = (PX + G::PW) % G::SW;
    constexpr int NA = ky0 < G::KH ? cdiv(G::KH - ky0, G::SH) : 0, NB = kx0 < G::KW ? cdiv(G::KW - kx0, G::SW) : 0;
    constexpr long U0 = (PY + G::PH) / G::SH, V0 = (PX + G::PW) / G::SW;
    constexpr long WU = PX < G::W ? cdiv(G::W - PX, G::SW) : 0;  // this phase's pixels per row
    constexpr long KK = G::KH * G::KW;
    for (long iy = iy0 + PY; iy < cmin(iy0 + G::BAND, G::H); iy += G::SH) {
      const long u = iy / G::SH;
      for (long v0 = 0; v0 < WU; v0 += NV * VW) {
        vf acc[M][NV];
        CNNC_UNROLL
        for (int m = 0; m < M; m++)
          CNNC_UNROLL
          for (int j = 0; j < NV; j++) acc[m][j] = vzero();
        for (long o = 0; o < G::O; o++) {
          const float* wo = w + (o * G::C + c0) * KK;
          CNNC_UNROLL
          for (int a = 0; a < NA; a++) {
            const float* dr = Dt + (o * DR + (U0 + u - a - oyLo)) * DW + QL + V0 + v0;
            CNNC_UNROLL
            for (int bb = 0; bb < NB; bb++) {
              vf xv[NV];
              CNNC_UNROLL
              for (int j = 0; j < NV; j++) xv[j] = vload(dr - bb + j * VW);
              CNNC_UNROLL
              for (int m = 0; m < M; m++) {
                const vf wv = vbcast(wo[m * KK + (ky0 + G::SH * a) * G::KW + kx0 + G::SW * bb]);
                CNNC_UNROLL
                for (int j = 0; j < NV; j++) acc[m][j] += wv * xv[j];
              }
            }
          }
        }
        CNNC_UNROLL
        for (int m = 0; m < M; m++) {
          const long plane = ((b * G::C + c0 + m) * G::H + iy) * G::W;
          CNNC_UNROLL
          for (int j = 0; j < NV; j++) {
            const long v = v0 + j * VW;
            vf val = acc[m][j];
            if constexpr (G::SW == 1) {
              const long ix = PX + v;
              if (v + VW <= WU) {
                if constexpr (G::MASKOUT) val = vload(xmask + plane + ix) > vf{} ? val : vf{};
                vstore(dx + plane + ix, val);
                continue;
              }
            }
            for (int l = 0; l < VW && v + l < WU; l++) {
              const long at = plane + PX + G::SW * (v + l);
              float e = val[l];
              if constexpr (G::MASKOUT) e = xmask[at] > 0.0f ? e : 0.0f;
              dx[at] = e;
            }
          }
        }
      }
    }
  }

  template <int M>
  CNNC_MEMBER static void channels(const float* Dt, const float* w, const float* xmask, float* dx, long b, long c0, long iy0, long oyLo) {
    static_for<G::SH * G::SW>([&]<int PH_>() {
      phase_rows<PH_ / G::SW, PH_ % G::SW, M>(Dt, w, xmask, dx, b, c0, iy0, oyLo);
    });
  }

  static void run(const uint64_t* p, int64_t task, float* s) {
    int a = 0;
    const float* dout = arg<const float>(p, a++);
    const float* w = arg<const float>(p, a++);
    const uint32_t* am = G::POOL ? arg<const uint32_t>(p, a++) : nullptr;
    const float* yout = G::HASY ? arg<const float>(p, a++) : nullptr;
    const float* xmask = G::MASKOUT ? arg<const float>(p, a++) : nullptr;
    float* dx = arg<float>(p, a++);
    const long cg = task % NCG, band = task / NCG % NBANDS, b = task / (NCG * NBANDS);
    const long cc = cg * G::OT, nc = cmin(G::OT, G::C - cc);
    const long iy0 = band * G::BAND;
    const long oyLo = iy0 / G::SH + G::PH / G::SH - (KHP - 1);
    form_dy<G, F>(dout, am, yout, b, 0, G::O, oyLo, DR, DW, QL, s);
    long m0 = 0;
    for (; m0 + MC <= nc; m0 += MC) channels<MC>(s, w, xmask, dx, b, cc + m0, iy0, oyLo);
    if (m0 < nc)
      dispatch_tail2<G::OT % MC, (G::C - (NCG - 1) * G::OT) % MC>(nc - m0, [&]<int M>() { channels<M>(s, w, xmask, dx, b, cc + m0, iy0, oyLo); });
  }
};

// conv_block weight gradient, first kernel: dw(o, c, ky, kx) = sum over (b, oy, ox) of
// dy(o, oy, ox)·x(c, oy·SH - PH + ky, ox·SW - PW + kx), db(o) = sum of dy(o, ·). The reduction runs over
// units (NS samples, band of BAND conv rows; NS > 1 only where a band is the whole map), split
// into S tasks of consecutive units; a task stages each unit's dy and input rows (a block per
// sample), accumulates MO x NK register tiles (vectors across output columns) over the unit's
// samples and rows, adds their lane sums into its own sums in unit order, and writes them
// to partial[task] (the plan's workspace). ConvWgradReduce adds the S partial sums in task order.
// Several samples a unit keep the lane sums few where maps are small (ResNet's 8x8 and 4x4).
template <class G, class F = NoActF>
struct ConvWgrad {
  static constexpr int MO = 3, NK = 3;
  static constexpr long K = G::C * G::KH * G::KW;
  static constexpr long WE = G::O * K + (G::BIAS ? G::O : 0);
  static constexpr long NBANDS = cdiv(G::HO, G::BAND), UNITS = cdiv(G::B, G::NS) * NBANDS;
  static_assert(G::NS == 1 || NBANDS == 1, "several samples a unit only where a band is the whole map");
  static constexpr long tasks = G::S;
  static constexpr long WOP = rup(G::WO, VW);
  static constexpr long JW = WOP + (G::KW - 1) / G::SW;
  static constexpr long IR = (G::BAND - 1) * G::SH + G::KH;
  static constexpr long XT1 = floats64(G::C * IR * G::SW * JW), DT1 = floats64(G::O * G::BAND * WOP);  // one sample's
  static constexpr long XT = G::NS * XT1, DT = G::NS * DT1, ACC = floats64(WE);
  static constexpr long scratch = XT + DT + ACC;

  template <int M, int N>
  CNNC_MEMBER static void tile(const float* Xt, const float* Dt, long ns, long nr, long o0, long c, long ky, long kx0, float* accm) {
    vf acc[M][N];
    CNNC_UNROLL
    for (int m = 0; m < M; m++)
      CNNC_UNROLL
      for (int k = 0; k < N; k++) acc[m][k] = vzero();
    for (long sr = 0; sr < ns * nr; sr++) {
      const long si = sr / nr, r = sr % nr;
      const float* xr = Xt + si * (XT1 / 4) + ((c * IR + r * G::SH + ky) * G::SW) * JW;
      const float* dr = Dt + si * (DT1 / 4) + (o0 * G::BAND + r) * WOP;
      for (long x0 = 0; x0 < WOP; x0 += VW) {
        vf dv[M], xv[N];
        CNNC_UNROLL
        for (int m = 0; m < M; m++) dv[m] = vload(dr + m * G::BAND * WOP + x0);
        CNNC_UNROLL
        for (int k = 0; k < N; k++) xv[k] = vload(xr + ((kx0 + k) % G::SW) * JW + (kx0 + k) / G::SW + x0);
        CNNC_UNROLL
        for (int m = 0; m < M; m++)
          CNNC_UNROLL
          for (int k = 0; k < N; k++) acc[m][k] += dv[m] * xv[k];
      }
    }
    CNNC_UNROLL
    for (int m = 0; m < M; m++)
      CNNC_UNROLL
      for (int k = 0; k < N; k++) accm[(o0 + m) * K + (c * G::KH + ky) * G::KW + kx0 + k] += hsum(acc[m][k]);
  }

  template <int M>
  CNNC_MEMBER static void outs(const float* Xt, const float* Dt, long ns, long nr, long o0, float* accm) {
    for (long c = 0; c < G::C; c++)
      for (long ky = 0; ky < G::KH; ky++) {
        long kx = 0;
        for (; kx + NK <= G::KW; kx += NK) tile<M, NK>(Xt, Dt, ns, nr, o0, c, ky, kx, accm);
        if constexpr (G::KW % NK != 0) tile<M, G::KW % NK>(Xt, Dt, ns, nr, o0, c, ky, kx, accm);
      }
  }

  static void run(const uint64_t* p, int64_t task, float* s) {
    int a = 0;
    const float* dout = arg<const float>(p, a++);
    const void* x = arg<const void>(p, a++);
    const uint32_t* am = G::POOL ? arg<const uint32_t>(p, a++) : nullptr;
    const float* yout = G::HASY ? arg<const float>(p, a++) : nullptr;
    float* partial = arg<float>(p, a++);
    const int augArg = a;
    float* Xt = s;
    float* Dt = s + XT / 4;
    float* accm = s + (XT + DT) / 4;
    memset(accm, 0, sizeof(float) * WE);
    const long u0 = task * UNITS / G::S, u1 = (task + 1) * UNITS / G::S;
    for (long u = u0; u < u1; u++) {
      const long b0 = u / NBANDS * G::NS, ns = cmin(G::NS, G::B - b0);
      const long cy0 = u % NBANDS * G::BAND, nr = cmin(G::BAND, G::HO - cy0);
      for (long si = 0; si < ns; si++) {
        form_dy<G, F>(dout, am, yout, b0 + si, 0, G::O, cy0, G::BAND, WOP, 0, Dt + si * (DT1 / 4));
        AugBox box{};
        if constexpr (Augments<G>) box = aug_sample<G>(p, augArg, b0 + si);
        fill_x<G, IR, JW>(x, b0 + si, cy0 * G::SH - G::PH, Xt + si * (XT1 / 4), &box);
      }
      if constexpr (G::BIAS) {
        for (long o = 0; o < G::O; o++) {
          vf sv = vzero();
          for (long si = 0; si < ns; si++)
            for (long r = 0; r < nr; r++)
              for (long x0 = 0; x0 < WOP; x0 += VW) sv += vload(Dt + si * (DT1 / 4) + (o * G::BAND + r) * WOP + x0);
          accm[G::O * K + o] += hsum(sv);
        }
      }
      long o0 = 0;
      for (; o0 + MO <= G::O; o0 += MO) outs<MO>(Xt, Dt, ns, nr, o0, accm);
      if constexpr (G::O % MO != 0) outs<G::O % MO>(Xt, Dt, ns, nr, o0, accm);
    }
    memcpy(partial + task * WE, accm, sizeof(float) * WE);
  }
};

// conv_block weight gradient, second kernel: the S partial sums added in task order, then written
// to dw (and db), added to them (ACC: a micro-batch's share), or applied by the fused optimizer
// update O to the weight (and bias) and their state. Tasks are runs of CHUNK elements.
template <class G, class O>
struct ConvWgradReduce {
  static constexpr long K = G::C * G::KH * G::KW, WEL = G::O * K;
  static constexpr long WE = WEL + (G::BIAS ? G::O : 0);
  static constexpr long CHUNK = 1024;
  static constexpr long tasks = cdiv(WE, CHUNK);
  static constexpr long scratch = floats64(CHUNK);

  static void run(const uint64_t* p, int64_t task, float* s) {
    const float* partial = arg<const float>(p, 0);
    const long e0 = task * CHUNK, e1 = cmin(WE, e0 + CHUNK), n = e1 - e0;
    float* g = s;
    for (long i = 0; i < n; i++) g[i] = partial[e0 + i];
    for (long t = 1; t < G::S; t++) {
      const float* pt = partial + t * WE + e0;
      for (long i = 0; i < n; i++) g[i] += pt[i];
    }
    // the weight elements [e0, min(e1, WEL)), then the bias elements
    const long nw = cmax(0, cmin(e1, WEL) - e0), nb = n - nw;
    const long b0 = e0 + nw - WEL;  // first bias element
    if constexpr (O::KIND < 0) {
      float* dw = arg<float>(p, 1);
      float* db = G::BIAS ? arg<float>(p, 2) : nullptr;
      for (long i = 0; i < nw; i++) {
        if constexpr (G::ACC) dw[e0 + i] += g[i];
        else dw[e0 + i] = g[i];
      }
      for (long i = 0; i < nb; i++) {
        if constexpr (G::ACC) db[b0 + i] += g[nw + i];
        else db[b0 + i] = g[nw + i];
      }
    } else {
      constexpr int NS = opt_states<O>();
      constexpr int NP = G::BIAS ? 2 : 1;
      float* wp = arg<float>(p, 1);
      float* bp = G::BIAS ? arg<float>(p, 2) : nullptr;
      float* ws[2] = {nullptr, nullptr};
      float* bs[2] = {nullptr, nullptr};
      for (int k = 0; k < NS; k++) ws[k] = arg<float>(p, 1 + NP + k);
      if (G::BIAS)
        for (int k = 0; k < NS; k++) bs[k] = arg<float>(p, 1 + NP + NS + k);
      const CnncStepScalars& sc = argscalars(p, 1 + NP + NP * NS);
      const OptRun<O> run(sc.lr, sc.step);
      if (nw > 0) opt_range<O>(run, g, wp + e0, ws[0] ? ws[0] + e0 : nullptr, ws[1] ? ws[1] + e0 : nullptr, nw);
      if (nb > 0) opt_range<O>(run, g + nw, bp + b0, bs[0] ? bs[0] + b0 : nullptr, bs[1] ? bs[1] + b0 : nullptr, nb);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Direct convolutions (templates/direct_conv.cu.tmpl): the kernels of an unfused conv2d and its
// gradients — the convs the conv blocks do not take (grouped, depthwise, dilated). The geometry
// struct D has B, C, H, W (input), O, HO, WO (output), CG, OG (input and output channels per
// group), KH, KW, SH, SW, PH, PW, DH, DW (window, stride, padding, dilation), BIAS (forward: a
// bias), ACC (gradients: added to their outputs, a micro-batch's share) and PT (the planes or
// weight rows a task takes). The weight is [O][CG][KH][KW], as PyTorch stores it. Every output
// element is summed by one task in a fixed order (the CUDA kernel's: bias, then input channel,
// ky, kx), vectors across output columns where the stride is 1.

// the output columns ox whose input column ox·SW - PW + koff lies inside [0, W): [lo, hi)
template <class D>
CNNC_INLINE void dc_cols(long koff, long& lo, long& hi) {
  lo = koff >= D::PW ? 0 : cdiv(D::PW - koff, D::SW);
  hi = D::W - 1 + D::PW - koff >= 0 ? cmin(D::WO, (D::W - 1 + D::PW - koff) / D::SW + 1) : 0;
  if (hi < lo) hi = lo;
}

// y(b, o, oy, ox) = bias(o) + Σ over c of o's group, ky, kx of w(o, c - c0, ky, kx)·x(b, c, oy·SH - PH +
// ky·DH, ox·SW - PW + kx·DW). A task is PT output planes (b, o); each row is summed in place.
template <class D>
struct DirectConvFwd {
  static constexpr long PLANES = D::B * D::O;
  static constexpr long tasks = cdiv(PLANES, D::PT), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    int a = 0;
    const float* __restrict__ x = arg<const float>(p, a++);
    const float* __restrict__ w = arg<const float>(p, a++);
    const float* bias = D::BIAS ? arg<const float>(p, a++) : nullptr;
    float* __restrict__ y = arg<float>(p, a++);
    const long p1 = cmin(PLANES, (task + 1) * D::PT);
    for (long plane = task * D::PT; plane < p1; plane++) {
      const long b = plane / D::O, o = plane % D::O, c0 = o / D::OG * D::CG;
      for (long oy = 0; oy < D::HO; oy++) {
        float* __restrict__ yr = y + (plane * D::HO + oy) * D::WO;
        const float b0 = D::BIAS ? bias[o] : 0.0f;
        for (long ox = 0; ox < D::WO; ox++) yr[ox] = b0;
        for (long cl = 0; cl < D::CG; cl++) {
          const float* xc = x + (b * D::C + c0 + cl) * D::H * D::W;
          const float* wc = w + (o * D::CG + cl) * D::KH * D::KW;
          for (long ky = 0; ky < D::KH; ky++) {
            const long iy = oy * D::SH - D::PH + ky * D::DH;
            if (iy < 0 || iy >= D::H) continue;
            for (long kx = 0; kx < D::KW; kx++) {
              long lo, hi;
              dc_cols<D>(kx * D::DW, lo, hi);
              const float wv = wc[ky * D::KW + kx];
              const float* __restrict__ xs = xc + iy * D::W - D::PW + kx * D::DW;
              for (long ox = lo; ox < hi; ox++) yr[ox] += wv * xs[ox * D::SW];
            }
          }
        }
      }
    }
  }
};

// dx(b, c, iy, ix) = Σ over the o of c's group, ky, kx of w(o, c - c0, ky, kx)·dy(b, o, oy, ox) for the
// (oy, ox) whose tap (ky, kx) reads (iy, ix). A task is PT input planes (b, c), zeroed and then
// scattered into in the order o, ky, kx (each element gets at most one term per (o, ky, kx)).
template <class D>
struct DirectConvDgrad {
  static constexpr long PLANES = D::B * D::C;
  static constexpr long tasks = cdiv(PLANES, D::PT), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* __restrict__ dy = arg<const float>(p, 0);
    const float* __restrict__ w = arg<const float>(p, 1);
    float* __restrict__ dx = arg<float>(p, 2);
    const long p1 = cmin(PLANES, (task + 1) * D::PT);
    for (long plane = task * D::PT; plane < p1; plane++) {
      const long b = plane / D::C, c = plane % D::C, grp = c / D::CG, cl = c % D::CG;
      float* __restrict__ dxp = dx + plane * D::H * D::W;
      for (long i = 0; i < D::H * D::W; i++) dxp[i] = 0.0f;
      for (long o = grp * D::OG; o < (grp + 1) * D::OG; o++) {
        const float* dyo = dy + (b * D::O + o) * D::HO * D::WO;
        const float* wo = w + (o * D::CG + cl) * D::KH * D::KW;
        for (long ky = 0; ky < D::KH; ky++)
          for (long kx = 0; kx < D::KW; kx++) {
            long lo, hi;
            dc_cols<D>(kx * D::DW, lo, hi);
            const float wv = wo[ky * D::KW + kx];
            for (long oy = 0; oy < D::HO; oy++) {
              const long iy = oy * D::SH - D::PH + ky * D::DH;
              if (iy < 0 || iy >= D::H) continue;
              float* __restrict__ dr = dxp + iy * D::W - D::PW + kx * D::DW;
              const float* __restrict__ dyr = dyo + oy * D::WO;
              for (long ox = lo; ox < hi; ox++) dr[ox * D::SW] += wv * dyr[ox];
            }
          }
      }
    }
  }
};

// dw(o, cl, ky, kx) = Σ over samples and output positions of dy(b, o, oy, ox)·x(b, c0 + cl, iy, ix): a
// task is PT weight rows (o, cl), each tap's sum a row's fp32 dot product added in double, over
// samples and rows in order.
template <class D>
struct DirectConvWgrad {
  static constexpr long ROWS = D::O * D::CG, KK = D::KH * D::KW;
  static constexpr long tasks = cdiv(ROWS, D::PT), scratch = floats64(2 * KK);
  static void run(const uint64_t* p, int64_t task, float* s) {
    const float* __restrict__ dy = arg<const float>(p, 0);
    const float* __restrict__ x = arg<const float>(p, 1);
    float* __restrict__ dw = arg<float>(p, 2);
    double* acc = reinterpret_cast<double*>(s);
    const long r1 = cmin(ROWS, (task + 1) * D::PT);
    for (long row = task * D::PT; row < r1; row++) {
      const long o = row / D::CG, cl = row % D::CG, c = o / D::OG * D::CG + cl;
      for (long k = 0; k < KK; k++) acc[k] = 0.0;
      for (long b = 0; b < D::B; b++) {
        const float* dyo = dy + (b * D::O + o) * D::HO * D::WO;
        const float* xc = x + (b * D::C + c) * D::H * D::W;
        for (long oy = 0; oy < D::HO; oy++) {
          const float* __restrict__ dyr = dyo + oy * D::WO;
          for (long ky = 0; ky < D::KH; ky++) {
            const long iy = oy * D::SH - D::PH + ky * D::DH;
            if (iy < 0 || iy >= D::H) continue;
            for (long kx = 0; kx < D::KW; kx++) {
              long lo, hi;
              dc_cols<D>(kx * D::DW, lo, hi);
              const float* __restrict__ xs = xc + iy * D::W - D::PW + kx * D::DW;
              float sum = 0.0f;
              for (long ox = lo; ox < hi; ox++) sum += dyr[ox] * xs[ox * D::SW];
              acc[ky * D::KW + kx] += sum;
            }
          }
        }
      }
      float* dwr = dw + row * KK;
      for (long k = 0; k < KK; k++) {
        if constexpr (D::ACC) dwr[k] += static_cast<float>(acc[k]);
        else dwr[k] = static_cast<float>(acc[k]);
      }
    }
  }
};

// db(o) = Σ over samples and positions of dy(b, o, ·): a task is PT channels, each row's fp32 sum
// added in double, over samples and rows in order.
template <class D>
struct DirectConvBgrad {
  static constexpr long tasks = cdiv(D::O, D::PT), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* dy = arg<const float>(p, 0);
    float* db = arg<float>(p, 1);
    const long o1 = cmin(D::O, (task + 1) * D::PT);
    for (long o = task * D::PT; o < o1; o++) {
      double acc = 0.0;
      for (long b = 0; b < D::B; b++)
        for (long oy = 0; oy < D::HO; oy++) {
          const float* dyr = dy + ((b * D::O + o) * D::HO + oy) * D::WO;
          float sum = 0.0f;
          for (long ox = 0; ox < D::WO; ox++) sum += dyr[ox];
          acc += sum;
        }
      if constexpr (D::ACC) db[o] += static_cast<float>(acc);
      else db[o] = static_cast<float>(acc);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// conv2d -> tanh -> avgpool2d blocks (codegen/cpu/conv_pool.go; compiler/ops/conv_tanh_pool.go).
// The geometry struct P has B, C, H, W, U8 (the input is the u8 [H,W,C] image, /255 as it
// loads), O, KH, KW, SH, SW, PH, PW, HO, WO (the conv), PKH, PKW, PSH, PSW, PPH, PPW, PHO, PWO
// (the average pool, padding counted in the divisor), BIAS, SAVE (the forward writes t =
// tanh(conv), which the backward reads; without it the weight gradient recomputes t with
// cp_t, the forward's own function), ACC and PT (planes a task). Every sum runs in a fixed
// order; the weight gradient's rows add in double.

template <class P>
CNNC_INLINE float cp_x(const void* xv, long b, long c, long iy, long ix) {
  if (iy < 0 || iy >= P::H || ix < 0 || ix >= P::W) return 0.0f;
  if constexpr (P::U8)
    return static_cast<float>(static_cast<const uint8_t*>(xv)[((b * P::H + iy) * P::W + ix) * P::C + c]) * (1.0f / 255.0f);
  else
    return static_cast<const float*>(xv)[((b * P::C + c) * P::H + iy) * P::W + ix];
}

// tanh of conv output (o, oy, ox) of sample b: the bias plus the taps in (c, ky, kx) order.
template <class P>
CNNC_INLINE float cp_t(const void* x, const float* w, const float* bias, long b, long o, long oy, long ox) {
  float acc = P::BIAS ? bias[o] : 0.0f;
  const float* wo = w + o * P::C * P::KH * P::KW;
  for (long c = 0; c < P::C; c++)
    for (long ky = 0; ky < P::KH; ky++)
      for (long kx = 0; kx < P::KW; kx++)
        acc += cp_x<P>(x, b, c, oy * P::SH - P::PH + ky, ox * P::SW - P::PW + kx) * wo[(c * P::KH + ky) * P::KW + kx];
  return tanhf(acc);
}

// the pooled gradient of plane (b, o) summed over the windows holding conv output (oy, ox), over
// the window size; covered says whether any window holds it (else its gradient is 0).
template <class P>
CNNC_INLINE float cp_dsum(const float* dout, long plane, long oy, long ox, bool& covered) {
  float s = 0.0f;
  covered = false;
  for (long py = cmax(0, fdiv(oy + P::PPH - P::PKH, P::PSH) + 1); py < P::PHO && py * P::PSH - P::PPH <= oy; py++)
    for (long px = cmax(0, fdiv(ox + P::PPW - P::PKW, P::PSW) + 1); px < P::PWO && px * P::PSW - P::PPW <= ox; px++) {
      s += dout[(plane * P::PHO + py) * P::PWO + px];
      covered = true;
    }
  return s * (1.0f / (P::PKH * P::PKW));
}

// dy over plane (b, o) at full resolution into d: the pooled gradient routed back through the
// windows, times 1 - t², t read (SAVE) or recomputed.
template <class P>
CNNC_INLINE void cp_dy(const float* dout, const void* x, const float* w, const float* bias, const float* t, long b, long o,
                       float* d) {
  const long plane = b * P::O + o;
  for (long oy = 0; oy < P::HO; oy++)
    for (long ox = 0; ox < P::WO; ox++) {
      bool covered;
      const float s = cp_dsum<P>(dout, plane, oy, ox, covered);
      float v = 0.0f;
      if (covered) {
        float tv;
        if constexpr (P::SAVE) tv = t[(plane * P::HO + oy) * P::WO + ox];
        else tv = cp_t<P>(x, w, bias, b, o, oy, ox);
        v = s * (1.0f - tv * tv);
      }
      d[oy * P::WO + ox] = v;
    }
}

// The forward: a task is PT planes (b, o). Without SAVE each pooled output averages the tanh of
// its window's conv outputs; with SAVE the plane's t is written, then pooled.
template <class P>
struct ConvPoolFwd {
  static constexpr long PLANES = P::B * P::O;
  static constexpr long tasks = cdiv(PLANES, P::PT), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    int a = 0;
    const void* x = arg<const void>(p, a++);
    const float* w = arg<const float>(p, a++);
    const float* bias = P::BIAS ? arg<const float>(p, a++) : nullptr;
    float* y = arg<float>(p, a++);
    float* t = P::SAVE ? arg<float>(p, a++) : nullptr;
    const long p1 = cmin(PLANES, (task + 1) * P::PT);
    for (long plane = task * P::PT; plane < p1; plane++) {
      const long b = plane / P::O, o = plane % P::O;
      float* tp = P::SAVE ? t + plane * P::HO * P::WO : nullptr;
      if constexpr (P::SAVE)
        for (long oy = 0; oy < P::HO; oy++)
          for (long ox = 0; ox < P::WO; ox++) tp[oy * P::WO + ox] = cp_t<P>(x, w, bias, b, o, oy, ox);
      for (long py = 0; py < P::PHO; py++)
        for (long px = 0; px < P::PWO; px++) {
          float s = 0.0f;
          for (long ky = 0; ky < P::PKH; ky++) {
            const long oy = py * P::PSH - P::PPH + ky;
            if (oy < 0 || oy >= P::HO) continue;
            for (long kx = 0; kx < P::PKW; kx++) {
              const long ox = px * P::PSW - P::PPW + kx;
              if (ox < 0 || ox >= P::WO) continue;
              if constexpr (P::SAVE) s += tp[oy * P::WO + ox];
              else s += cp_t<P>(x, w, bias, b, o, oy, ox);
            }
          }
          y[(plane * P::PHO + py) * P::PWO + px] = s * (1.0f / (P::PKH * P::PKW));
        }
    }
  }
};

// The input gradient (SAVE): a task is PT input planes (b, c), zeroed, then per o the plane's dy
// (cp_dy, in scratch) scattered through the taps in the order o, ky, kx.
template <class P>
struct ConvPoolDgrad {
  static constexpr long PLANES = P::B * P::C;
  static constexpr long tasks = cdiv(PLANES, P::PT), scratch = floats64(P::HO * P::WO);
  static void run(const uint64_t* p, int64_t task, float* s) {
    const float* dout = arg<const float>(p, 0);
    const float* w = arg<const float>(p, 1);
    const float* t = arg<const float>(p, 2);
    float* dx = arg<float>(p, 3);
    const long p1 = cmin(PLANES, (task + 1) * P::PT);
    for (long plane = task * P::PT; plane < p1; plane++) {
      const long b = plane / P::C, c = plane % P::C;
      float* dxp = dx + plane * P::H * P::W;
      for (long i = 0; i < P::H * P::W; i++) dxp[i] = 0.0f;
      for (long o = 0; o < P::O; o++) {
        cp_dy<P>(dout, nullptr, nullptr, nullptr, t, b, o, s);
        const float* wo = w + (o * P::C + c) * P::KH * P::KW;
        for (long ky = 0; ky < P::KH; ky++)
          for (long kx = 0; kx < P::KW; kx++) {
            const float wv = wo[ky * P::KW + kx];
            for (long oy = 0; oy < P::HO; oy++) {
              const long iy = oy * P::SH - P::PH + ky;
              if (iy < 0 || iy >= P::H) continue;
              for (long ox = 0; ox < P::WO; ox++) {
                const long ix = ox * P::SW - P::PW + kx;
                if (ix >= 0 && ix < P::W) dxp[iy * P::W + ix] += wv * s[oy * P::WO + ox];
              }
            }
          }
      }
    }
  }
};

// The weight and bias gradients: a task is PT output channels o; per sample, the plane's dy
// (cp_dy, in scratch), then each weight (c, ky, kx) adds its rows' fp32 dot products in double
// (the bias: the rows' sums).
template <class P>
struct ConvPoolWgrad {
  static constexpr long KK = P::C * P::KH * P::KW;
  static constexpr long tasks = cdiv(P::O, P::PT), scratch = floats64(P::HO * P::WO) + floats64(2 * (KK + 1));
  static void run(const uint64_t* p, int64_t task, float* s) {
    int a = 0;
    const float* dout = arg<const float>(p, a++);
    const void* x = arg<const void>(p, a++);
    const float* t = P::SAVE ? arg<const float>(p, a++) : nullptr;
    const float* w = P::SAVE ? nullptr : arg<const float>(p, a++);
    const float* bias = !P::SAVE && P::BIAS ? arg<const float>(p, a++) : nullptr;
    float* dw = arg<float>(p, a++);
    float* db = P::BIAS ? arg<float>(p, a++) : nullptr;
    float* d = s;
    double* acc = reinterpret_cast<double*>(s + floats64(P::HO * P::WO) / 4);
    const long o1 = cmin(P::O, (task + 1) * P::PT);
    for (long o = task * P::PT; o < o1; o++) {
      for (long k = 0; k <= KK; k++) acc[k] = 0.0;
      for (long b = 0; b < P::B; b++) {
        cp_dy<P>(dout, x, w, bias, t, b, o, d);
        for (long oy = 0; oy < P::HO; oy++) {
          const float* dr = d + oy * P::WO;
          float bs = 0.0f;
          for (long ox = 0; ox < P::WO; ox++) bs += dr[ox];
          acc[KK] += bs;
          for (long c = 0; c < P::C; c++)
            for (long ky = 0; ky < P::KH; ky++)
              for (long kx = 0; kx < P::KW; kx++) {
                float sum = 0.0f;
                for (long ox = 0; ox < P::WO; ox++)
                  sum += dr[ox] * cp_x<P>(x, b, c, oy * P::SH - P::PH + ky, ox * P::SW - P::PW + kx);
                acc[(c * P::KH + ky) * P::KW + kx] += sum;
              }
        }
      }
      for (long k = 0; k < KK; k++) {
        if constexpr (P::ACC) dw[o * KK + k] += static_cast<float>(acc[k]);
        else dw[o * KK + k] = static_cast<float>(acc[k]);
      }
      if constexpr (P::BIAS) {
        if constexpr (P::ACC) db[o] += static_cast<float>(acc[KK]);
        else db[o] = static_cast<float>(acc[KK]);
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Linear blocks (W is [N][K] = [out][in]). The geometry struct L has B, K (in), N (out), BIAS,
// RELU, ACT, SAVEZ, HASY, MASKOUT, ACC, and the decomposition: TILE (output columns of a forward
// task, input columns of a gradient task). F is the folded activation other than ReLU (ACT; the
// functors below, NoActF for none): the forward applies F::f to z = x·Wᵀ (+ b), writing z too
// with SAVEZ; the gradients take dy' = F::g(dy, s), s the saved y or z (HASY's input).

// y = x·Wᵀ (+ b) (ReLU or F::f), z saved (SAVEZ). A task is TILE outputs (rows of W) for BT samples; the reduction over K
// runs in chunks of KC (the chunk of x and of the task's W rows stays in cache) with MB x NB
// register tiles of vectors along K, kept in the task's scratch between chunks; each output is
// its lanes' sum (in lane order) plus the scalar tail, so its order is fixed.
template <class L, class F>
struct LinFwd {
  static constexpr int MB = 3, NB = 3;
  static constexpr long KC = 512;
  static constexpr long KV = L::K / VW * VW;  // the vector part of K
  static constexpr long NT = cdiv(L::N, L::TILE), NBT = cdiv(L::B, L::BT);
  static constexpr long tasks = NT * NBT;
  static constexpr long scratch = floats64(L::BT * L::TILE * VW);

  // accs holds the task's vector sums: sample i (of the task's), output j at (i * nt + j) * VW
  template <int M, int N>
  CNNC_MEMBER static void tile(const float* x, const float* w, long bi, long b0, long n0, long ji, long nt, long k0, long k1, float* accs) {
    vf acc[M][N];
    CNNC_UNROLL
    for (int m = 0; m < M; m++)
      CNNC_UNROLL
      for (int n = 0; n < N; n++) acc[m][n] = k0 == 0 ? vzero() : vload(accs + ((bi + m) * nt + ji + n) * VW);
    for (long k = k0; k < k1; k += VW) {
      vf xv[M], wv[N];
      CNNC_UNROLL
      for (int m = 0; m < M; m++) xv[m] = vload(x + (b0 + bi + m) * L::K + k);
      CNNC_UNROLL
      for (int n = 0; n < N; n++) wv[n] = vload(w + (n0 + ji + n) * L::K + k);
      CNNC_UNROLL
      for (int m = 0; m < M; m++)
        CNNC_UNROLL
        for (int n = 0; n < N; n++) acc[m][n] += xv[m] * wv[n];
    }
    CNNC_UNROLL
    for (int m = 0; m < M; m++)
      CNNC_UNROLL
      for (int n = 0; n < N; n++) vstore(accs + ((bi + m) * nt + ji + n) * VW, acc[m][n]);
  }

  template <int M>
  CNNC_MEMBER static void rowsOf(const float* x, const float* w, long bi, long b0, long n0, long nt, long k0, long k1, float* accs) {
    long j = 0;
    for (; j + NB <= nt; j += NB) tile<M, NB>(x, w, bi, b0, n0, j, nt, k0, k1, accs);
    if (j < nt)
      dispatch_tail2<L::TILE % NB, (L::N - (NT - 1) * L::TILE) % NB>(nt - j, [&]<int N>() { tile<M, N>(x, w, bi, b0, n0, j, nt, k0, k1, accs); });
  }

  static void run(const uint64_t* p, int64_t task, float* s) {
    int a = 0;
    const float* x = arg<const float>(p, a++);
    const float* w = arg<const float>(p, a++);
    const float* bias = L::BIAS ? arg<const float>(p, a++) : nullptr;
    float* y = arg<float>(p, a++);
    float* z = L::SAVEZ ? arg<float>(p, a++) : nullptr;
    const long n0 = task % NT * L::TILE, nt = cmin(L::TILE, L::N - n0);
    const long b0 = task / NT * L::BT, bt = cmin(L::BT, L::B - b0);
    if constexpr (KV > 0) {
      for (long k0 = 0; k0 < KV; k0 += KC) {
        const long k1 = cmin(KV, k0 + KC);
        long i = 0;
        for (; i + MB <= bt; i += MB) rowsOf<MB>(x, w, i, b0, n0, nt, k0, k1, s);
        if (i < bt)
          dispatch_tail2<L::BT % MB, (L::B - (NBT - 1) * L::BT) % MB>(bt - i, [&]<int M>() { rowsOf<M>(x, w, i, b0, n0, nt, k0, k1, s); });
      }
    }
    for (long i = 0; i < bt; i++)
      for (long j = 0; j < nt; j++) {
        const long b = b0 + i, n = n0 + j;
        float v = KV > 0 ? hsum(vload(s + (i * nt + j) * VW)) : 0.0f;
        for (long k = KV; k < L::K; k++) v += x[b * L::K + k] * w[n * L::K + k];
        if constexpr (L::BIAS) v += bias[n];
        if constexpr (L::SAVEZ) z[b * L::N + n] = v;
        if constexpr (L::RELU) v = v > 0.0f ? v : 0.0f;
        if constexpr (L::ACT) v = F::f(v);
        y[b * L::N + n] = v;
      }
  }
};

// dx = dy'·W (· [xmask > 0]), dy' = dy masked by the block's ReLU (y > 0) unless it arrives
// masked, or F::g(dy, s) (ACT). A task is TILE input columns for the whole batch: MB x NV register tiles, the sum over the
// N outputs in order (n = 0, 1, ...), so every element's order is fixed. dx may be xmask.
template <class L, class F>
struct LinDgrad {
  static constexpr int MB = 4, NV = 3;
  static constexpr long tasks = cdiv(L::K, L::TILE);
  static constexpr long scratch = 0;

  CNNC_MEMBER static float dyAt(const float* dy, const float* ym, long b, long n) {
    if constexpr (L::ACT) return F::g(dy[b * L::N + n], ym[b * L::N + n]);
    else if constexpr (L::HASY) return masked(ym[b * L::N + n], dy[b * L::N + n]);
    return dy[b * L::N + n];
  }

  template <int M>
  CNNC_MEMBER static void rowsOf(const float* dy, const float* ym, const float* w, const float* xmask, float* dx, long b0, long k0, long k1) {
    long k = k0;
    for (; k + NV * VW <= k1; k += NV * VW) {
      vf acc[M][NV];
      CNNC_UNROLL
      for (int m = 0; m < M; m++)
        CNNC_UNROLL
        for (int j = 0; j < NV; j++) acc[m][j] = vzero();
      for (long n = 0; n < L::N; n++) {
        vf wv[NV];
        CNNC_UNROLL
        for (int j = 0; j < NV; j++) wv[j] = vload(w + n * L::K + k + j * VW);
        CNNC_UNROLL
        for (int m = 0; m < M; m++) {
          const vf d = vbcast(dyAt(dy, ym, b0 + m, n));
          CNNC_UNROLL
          for (int j = 0; j < NV; j++) acc[m][j] += d * wv[j];
        }
      }
      CNNC_UNROLL
      for (int m = 0; m < M; m++)
        CNNC_UNROLL
        for (int j = 0; j < NV; j++) {
          const long at = (b0 + m) * L::K + k + j * VW;
          vf v = acc[m][j];
          if constexpr (L::MASKOUT) v = vload(xmask + at) > vf{} ? v : vf{};
          vstore(dx + at, v);
        }
    }
    for (; k < k1; k++) {  // the tail, one column at a time
      float acc[M];
      CNNC_UNROLL
      for (int m = 0; m < M; m++) acc[m] = 0.0f;
      for (long n = 0; n < L::N; n++)
        CNNC_UNROLL
        for (int m = 0; m < M; m++) acc[m] += dyAt(dy, ym, b0 + m, n) * w[n * L::K + k];
      CNNC_UNROLL
      for (int m = 0; m < M; m++) {
        const long at = (b0 + m) * L::K + k;
        float v = acc[m];
        if constexpr (L::MASKOUT) v = xmask[at] > 0.0f ? v : 0.0f;
        dx[at] = v;
      }
    }
  }

  static void run(const uint64_t* p, int64_t task, float*) {
    int a = 0;
    const float* dy = arg<const float>(p, a++);
    const float* w = arg<const float>(p, a++);
    const float* ym = L::HASY ? arg<const float>(p, a++) : nullptr;
    const float* xmask = L::MASKOUT ? arg<const float>(p, a++) : nullptr;
    float* dx = arg<float>(p, a++);
    const long k0 = task * L::TILE, k1 = cmin(L::K, k0 + L::TILE);
    long b = 0;
    for (; b + MB <= L::B; b += MB) rowsOf<MB>(dy, ym, w, xmask, dx, b, k0, k1);
    if constexpr (L::B % MB != 0) rowsOf<L::B % MB>(dy, ym, w, xmask, dx, b, k0, k1);
  }
};

// dW = dy'ᵀ·x over the batch (in batch order), dB = the batch sum of dy' (by the task of the first
// columns); then written, added (ACC), or applied by the fused optimizer update O to W (and b) in
// place. A task is TILE input columns of every output row: MN x NV register tiles.
template <class L, class O, class F>
struct LinWgrad {
  static constexpr int MN = 4, NV = 3;
  static constexpr long tasks = cdiv(L::K, L::TILE);
  static constexpr long scratch = floats64(MN * NV * VW);

  CNNC_MEMBER static float dyAt(const float* dy, const float* ym, long b, long n) {
    if constexpr (L::ACT) return F::g(dy[b * L::N + n], ym[b * L::N + n]);
    else if constexpr (L::HASY) return masked(ym[b * L::N + n], dy[b * L::N + n]);
    return dy[b * L::N + n];
  }

  // the gradient g[0..cnt) of W row n at columns k.., then its fate
  CNNC_MEMBER static void finish(const OptRun<O>* run, float* const* wout, long n, long k, const float* g, long cnt) {
    const long at = n * L::K + k;
    if constexpr (O::KIND < 0) {
      for (long i = 0; i < cnt; i++) {
        if constexpr (L::ACC) wout[0][at + i] += g[i];
        else wout[0][at + i] = g[i];
      }
    } else {
      opt_range<O>(*run, g, wout[0] + at, wout[2] ? wout[2] + at : nullptr, wout[3] ? wout[3] + at : nullptr, cnt);
    }
  }

  template <int M>
  CNNC_MEMBER static void rowsOf(const float* dy, const float* ym, const float* x, const OptRun<O>* run, float* const* wout, long n0, long k0,
                                 long k1, float* s) {
    long k = k0;
    for (; k + NV * VW <= k1; k += NV * VW) {
      vf acc[M][NV];
      CNNC_UNROLL
      for (int m = 0; m < M; m++)
        CNNC_UNROLL
        for (int j = 0; j < NV; j++) acc[m][j] = vzero();
      for (long b = 0; b < L::B; b++) {
        vf xv[NV];
        CNNC_UNROLL
        for (int j = 0; j < NV; j++) xv[j] = vload(x + b * L::K + k + j * VW);
        CNNC_UNROLL
        for (int m = 0; m < M; m++) {
          const vf d = vbcast(dyAt(dy, ym, b, n0 + m));
          CNNC_UNROLL
          for (int j = 0; j < NV; j++) acc[m][j] += d * xv[j];
        }
      }
      CNNC_UNROLL
      for (int m = 0; m < M; m++) {
        CNNC_UNROLL
        for (int j = 0; j < NV; j++) vstore(s + j * VW, acc[m][j]);
        finish(run, wout, n0 + m, k, s, NV * VW);
      }
    }
    for (; k < k1; k++) {
      CNNC_UNROLL
      for (int m = 0; m < M; m++) {
        float acc = 0.0f;
        for (long b = 0; b < L::B; b++) acc += dyAt(dy, ym, b, n0 + m) * x[b * L::K + k];
        finish(run, wout, n0 + m, k, &acc, 1);
      }
    }
  }

  static void run(const uint64_t* p, int64_t task, float* s) {
    int a = 0;
    const float* dy = arg<const float>(p, a++);
    const float* x = arg<const float>(p, a++);
    const float* ym = L::HASY ? arg<const float>(p, a++) : nullptr;
    // wout: [0] dW or W, [1] dB or b, [2..3] W's states, [4..5] b's states
    float* wout[6] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
    wout[0] = arg<float>(p, a++);
    if (L::BIAS) wout[1] = arg<float>(p, a++);
    float lr = 0.0f;
    long step = 0;
    if constexpr (O::KIND >= 0) {
      constexpr int NS = opt_states<O>();
      for (int k = 0; k < NS; k++) wout[2 + k] = arg<float>(p, a++);
      if (L::BIAS)
        for (int k = 0; k < NS; k++) wout[4 + k] = arg<float>(p, a++);
      const CnncStepScalars& sc = argscalars(p, a++);
      lr = sc.lr;
      step = sc.step;
    }
    const OptRun<O> optRun(lr, step);
    const OptRun<O>* run = &optRun;
    const long k0 = task * L::TILE, k1 = cmin(L::K, k0 + L::TILE);
    long n = 0;
    for (; n + MN <= L::N; n += MN) rowsOf<MN>(dy, ym, x, run, wout, n, k0, k1, s);
    if constexpr (L::N % MN != 0) rowsOf<L::N % MN>(dy, ym, x, run, wout, n, k0, k1, s);
    if (L::BIAS && task == 0) {
      for (long o = 0; o < L::N; o++) {
        float g = 0.0f;
        for (long b = 0; b < L::B; b++) g += dyAt(dy, ym, b, o);
        if constexpr (O::KIND < 0) {
          if constexpr (L::ACC) wout[1][o] += g;
          else wout[1][o] = g;
        } else {
          opt_range<O>(*run, &g, wout[1] + o, wout[4] ? wout[4] + o : nullptr, wout[5] ? wout[5] + o : nullptr, 1);
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Softmax cross-entropy (templates/loss.cu.tmpl): one task. Rows past `valid` (a padded last
// batch) get zero gradient; inside a micro-batch loop (ACC) rows first.. of a batch of `valid`
// real rows, loss and correct added. The loss sum runs over rows in order. SMOOTH: PyTorch's
// label smoothing ε, the target q = ON·onehot(label) + OFF (ON = 1-ε, OFF = ε/CLASSES, rounded to
// float once by codegen/cpu), so a row's loss is lse - ON·x[label] - OFF·Σx and its gradient
// (softmax - q) / valid.
template <class L>
struct SoftmaxCE {
  static constexpr long tasks = 1;
  static constexpr long scratch = 0;
  static void run(const uint64_t* p, int64_t, float*) {
    const float* logits = arg<const float>(p, 0);
    const int32_t* label = arg<const int32_t>(p, 1);
    float* loss = arg<float>(p, 2);
    float* dlogits = arg<float>(p, 3);
    float* correct = arg<float>(p, 4);
    long valid = argscalars(p, 5).valid;
    const long first = argi(p, 6);
    long rows;
    float invBatch;
    if constexpr (L::ACC) {
      if (valid < 1) valid = 1;
      const long here = valid - first;
      rows = here < 0 ? 0 : (here > L::B ? L::B : here);
      invBatch = 1.0f / static_cast<float>(valid);
    } else {
      if (valid < 1 || valid > L::B) valid = L::B;
      rows = valid;
      invBatch = 1.0f / static_cast<float>(rows);
    }
    float total = 0.0f, hits = 0.0f;
    for (long r = rows; r < L::B; r++)
      for (long c = 0; c < L::CLASSES; c++) dlogits[r * L::CLASSES + c] = 0.0f;
    for (long r = 0; r < rows; r++) {
      const float* row = logits + r * L::CLASSES;
      float best = row[0];
      long bestIdx = 0;
      for (long c = 1; c < L::CLASSES; c++)
        if (row[c] > best) {
          best = row[c];
          bestIdx = c;
        }
      float sum = 0.0f;
      for (long c = 0; c < L::CLASSES; c++) sum += expf(row[c] - best);
      const float lse = best + logf(sum);
      const int32_t lab = label[r];
      const bool labelOK = lab >= 0 && lab < L::CLASSES;
      if constexpr (L::SMOOTH) {
        float rowSum = 0.0f;  // Σ x, for the smoothed target's ε·mean(x)
        for (long c = 0; c < L::CLASSES; c++) rowSum += row[c];
        for (long c = 0; c < L::CLASSES; c++) {
          float d = (expf(row[c] - lse) - L::OFF) * invBatch;  // ε/classes
          if (c == lab) d -= L::ON * invBatch;                 // 1 - ε
          dlogits[r * L::CLASSES + c] = d;
        }
        total += labelOK ? lse - L::ON * row[lab] - L::OFF * rowSum : NAN;
      } else {
        for (long c = 0; c < L::CLASSES; c++) {
          float d = expf(row[c] - lse) * invBatch;
          if (c == lab) d -= invBatch;
          dlogits[r * L::CLASSES + c] = d;
        }
        total += labelOK ? lse - row[lab] : NAN;  // NaN for a label out of range
      }
      hits += bestIdx == lab ? 1.0f : 0.0f;
    }
    if constexpr (L::ACC) {
      // the micro-batch's share rounded before it is added (volatile: no FMA contraction), as
      // when data-parallel ranks sum their shares (runtime/trainer's Reducer)
      volatile float share = total * invBatch;
      loss[0] += share;
      correct[0] += hits;
    } else {
      loss[0] = total * invBatch;
      correct[0] = hits;
    }
  }
};

// ---------------------------------------------------------------------------------------------
// The classifier tail (templates/linear_ce.cu.tmpl, compiler/ops/linear_cross_entropy.go): one
// task. logits = x·Wᵀ + b (each a sequential sum over IN), written to `logits`; the loss, the
// correct count and the logits' gradient dl as SoftmaxCE computes them (dl in the scratch, never
// in device memory); then dW = dlᵀ·x and dB = Σ dl (sums over the rows in order), fed to the
// optimizer O in place (or written / added, NoOpt), and with DX the input gradient dX = dl·W from
// the old W (dX runs before the update), MASKOUT: 0 where x <= 0. !BWD (evaluation, which runs the
// training graph's forward nodes): the logits, loss and correct count alone. Arguments: x, w, b?, label, loss, logits, correct, dx?,
// then W's states and b's (O) or dW, dB? (NoOpt), the step's scalars, the first row.
template <class L, class O>
struct LinearCE {
  static constexpr long tasks = 1;
  static constexpr long scratch = floats64(L::B * L::OUT);
  static void run(const uint64_t* p, int64_t, float* dl) {
    int a = 0;
    const float* x = arg<const float>(p, a++);
    float* w = arg<float>(p, a++);
    float* bias = L::BIAS ? arg<float>(p, a++) : nullptr;
    const int32_t* label = arg<const int32_t>(p, a++);
    float* loss = arg<float>(p, a++);
    float* logits = arg<float>(p, a++);
    float* correct = arg<float>(p, a++);
    float* dx = L::DX ? arg<float>(p, a++) : nullptr;
    // wout: [0] dW, [1] dB, [2..3] W's states, [4..5] b's states
    float* wout[6] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
    if constexpr (O::KIND >= 0) {
      constexpr int NS = opt_states<O>();
      for (int k = 0; k < NS; k++) wout[2 + k] = arg<float>(p, a++);
      if (L::BIAS)
        for (int k = 0; k < NS; k++) wout[4 + k] = arg<float>(p, a++);
    } else if constexpr (L::BWD) {
      wout[0] = arg<float>(p, a++);
      if (L::BIAS) wout[1] = arg<float>(p, a++);
    }
    const CnncStepScalars& sc = argscalars(p, a++);
    const long first = argi(p, a++);
    long valid = sc.valid;
    long rows;
    float invBatch;
    if constexpr (L::ACC) {
      if (valid < 1) valid = 1;
      const long here = valid - first;
      rows = here < 0 ? 0 : (here > L::B ? L::B : here);
      invBatch = 1.0f / static_cast<float>(valid);
    } else {
      if (valid < 1 || valid > L::B) valid = L::B;
      rows = valid;
      invBatch = 1.0f / static_cast<float>(rows);
    }
    for (long r = 0; r < L::B; r++)
      for (long o = 0; o < L::OUT; o++) {
        float s = 0.0f;
        for (long i = 0; i < L::IN; i++) s += x[r * L::IN + i] * w[o * L::IN + i];
        if constexpr (L::BIAS) s += bias[o];
        logits[r * L::OUT + o] = s;
      }
    float total = 0.0f, hits = 0.0f;
    for (long r = rows; r < L::B; r++)
      for (long c = 0; c < L::OUT; c++) dl[r * L::OUT + c] = 0.0f;
    for (long r = 0; r < rows; r++) {
      const float* row = logits + r * L::OUT;
      float best = row[0];
      long bestIdx = 0;
      for (long c = 1; c < L::OUT; c++)
        if (row[c] > best) {
          best = row[c];
          bestIdx = c;
        }
      float sum = 0.0f;
      for (long c = 0; c < L::OUT; c++) sum += expf(row[c] - best);
      const float lse = best + logf(sum);
      const int32_t lab = label[r];
      const bool labelOK = lab >= 0 && lab < L::OUT;
      if constexpr (L::SMOOTH) {
        float rowSum = 0.0f;
        for (long c = 0; c < L::OUT; c++) rowSum += row[c];
        for (long c = 0; c < L::OUT; c++) {
          float d = (expf(row[c] - lse) - L::OFF) * invBatch;
          if (c == lab) d -= L::ON * invBatch;
          dl[r * L::OUT + c] = d;
        }
        total += labelOK ? lse - L::ON * row[lab] - L::OFF * rowSum : NAN;
      } else {
        for (long c = 0; c < L::OUT; c++) {
          float d = expf(row[c] - lse) * invBatch;
          if (c == lab) d -= invBatch;
          dl[r * L::OUT + c] = d;
        }
        total += labelOK ? lse - row[lab] : NAN;
      }
      hits += bestIdx == lab ? 1.0f : 0.0f;
    }
    if constexpr (L::ACC) {
      volatile float share = total * invBatch;  // rounded before it is added, as SoftmaxCE's
      loss[0] += share;
      correct[0] += hits;
    } else {
      loss[0] = total * invBatch;
      correct[0] = hits;
    }
    if constexpr (L::DX) {
      for (long r = 0; r < L::B; r++)
        for (long i = 0; i < L::IN; i++) {
          float s = 0.0f;
          for (long o = 0; o < L::OUT; o++) s += dl[r * L::OUT + o] * w[o * L::IN + i];
          if constexpr (L::MASKOUT) s = x[r * L::IN + i] > 0.0f ? s : 0.0f;  // the producer's ReLU mask
          dx[r * L::IN + i] = s;
        }
    }
    if constexpr (!L::BWD) return;  // evaluation: the forward alone
    const OptRun<O> run(sc.lr, sc.step);
    for (long o = 0; o < L::OUT; o++) {
      for (long i = 0; i < L::IN; i++) {
        float g = 0.0f;
        for (long r = 0; r < L::B; r++) g += dl[r * L::OUT + o] * x[r * L::IN + i];
        const long at = o * L::IN + i;
        if constexpr (O::KIND < 0) {
          if constexpr (L::ACC) wout[0][at] += g;
          else wout[0][at] = g;
        } else {
          opt_range<O>(run, &g, w + at, wout[2] ? wout[2] + at : nullptr, wout[3] ? wout[3] + at : nullptr, 1);
        }
      }
      if constexpr (L::BIAS) {
        float g = 0.0f;
        for (long r = 0; r < L::B; r++) g += dl[r * L::OUT + o];
        if constexpr (O::KIND < 0) {
          if constexpr (L::ACC) wout[1][o] += g;
          else wout[1][o] = g;
        } else {
          opt_range<O>(run, &g, bias + o, wout[4] ? wout[4] + o : nullptr, wout[5] ? wout[5] + o : nullptr, 1);
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Elementwise kernels and standalone updates: tasks are runs of CHUNK elements. E has N (elements)
// and, for to_tensor, H, W, C.
constexpr long CHUNK = 16384;
#define CNNC_RANGE(n)                          \
  const long lo = task * CHUNK;                \
  const long hi = cmin(static_cast<long>(n), lo + CHUNK)

template <class E>
struct ToTensor {  // u8 HWC images -> f32 CHW / 255 (augmented: E::A, then scalars and the first sample)
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const unsigned char* in = arg<const unsigned char>(p, 0);
    float* out = arg<float>(p, 1);
    CNNC_RANGE(E::N);
    if constexpr (Augments<E>) {
      // augmented: the model's input [C, OH, OW] of each sample through its box, drawn once a sample
      using A = typename E::A;
      long cur = -1;
      AugBox box{};
      for (long i = lo; i < hi; i++) {
        const long x = i % A::OW, y = i / A::OW % A::OH, c = i / (A::OW * A::OH) % A::C, b = i / (A::OW * A::OH * A::C);
        if (b != cur) box = aug_sample<E>(p, 2, cur = b);
        out[i] = aug_pixel<A>(in + b * A::RH * A::RW * A::C, box, c, y, x);
      }
      return;
    }
    for (long i = lo; i < hi; i++) {
      const long x = i % E::W, y = i / E::W % E::H, c = i / (E::W * E::H) % E::C, b = i / (E::W * E::H * E::C);
      out[i] = static_cast<float>(in[((b * E::H + y) * E::W + x) * E::C + c]) * (1.0f / 255.0f);
    }
  }
};
template <class E>
struct Add {  // out = a + b (out may be a or b)
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* a = arg<const float>(p, 0);
    const float* b = arg<const float>(p, 1);
    float* out = arg<float>(p, 2);
    CNNC_RANGE(E::N);
    for (long i = lo; i < hi; i++) out[i] = a[i] + b[i];
  }
};
template <class E>
struct ReLU {  // out = max(x, 0) (out may be x)
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* x = arg<const float>(p, 0);
    float* out = arg<float>(p, 1);
    CNNC_RANGE(E::N);
    for (long i = lo; i < hi; i++) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
};
template <class E>
struct ReLUGrad {  // dx = dy where y > 0 (dx may be dy or y)
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* dy = arg<const float>(p, 0);
    const float* y = arg<const float>(p, 1);
    float* dx = arg<float>(p, 2);
    CNNC_RANGE(E::N);
    for (long i = lo; i < hi; i++) dx[i] = masked(y[i], dy[i]);
  }
};
// The activations other than ReLU (templates/activations.cu.tmpl's formulas, in the same fp32
// operations): Act<E, F> runs out = F::f(x), ActGrad<E, F> dx = F::g(dy, s), s the tensor the
// derivative reads (the input or the output, as compiler/ops says). Outputs may be written over
// inputs.
template <class E, class F>
struct Act {  // x, out
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* x = arg<const float>(p, 0);
    float* out = arg<float>(p, 1);
    CNNC_RANGE(E::N);
    for (long i = lo; i < hi; i++) out[i] = F::f(x[i]);
  }
};
template <class E, class F>
struct ActGrad {  // dy, s, dx
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* dy = arg<const float>(p, 0);
    const float* s = arg<const float>(p, 1);
    float* dx = arg<float>(p, 2);
    CNNC_RANGE(E::N);
    for (long i = lo; i < hi; i++) dx[i] = F::g(dy[i], s[i]);
  }
};
template <class E>
struct LeakyReLUF {  // E::SLOPE; the gradient reads x
  CNNC_INLINE float f(float v) { return v > 0.0f ? v : v * E::SLOPE; }
  CNNC_INLINE float g(float dy, float x) { return x > 0.0f ? dy : dy * E::SLOPE; }
};
struct SigmoidF {  // the gradient reads y
  CNNC_INLINE float f(float v) { return 1.0f / (1.0f + expf(-v)); }
  CNNC_INLINE float g(float dy, float y) { return dy * (1.0f - y) * y; }
};
struct TanhF {  // the gradient reads y
  CNNC_INLINE float f(float v) { return tanhf(v); }
  CNNC_INLINE float g(float dy, float y) { return dy * (1.0f - y * y); }
};
struct GELUF {  // x·Φ(x), the erf form; the gradient reads x: dy·(Φ(x) + x·φ(x))
  CNNC_INLINE float f(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }
  CNNC_INLINE float g(float dy, float v) {
    const float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
    const float pdf = expf(-0.5f * v * v) * 0.39894228040143268f;
    return dy * (cdf + v * pdf);
  }
};
struct SiLUF {  // x·sigmoid(x); the gradient reads x: dy·s·(1 + x·(1-s))
  CNNC_INLINE float f(float v) { return v / (1.0f + expf(-v)); }
  CNNC_INLINE float g(float dy, float v) {
    const float s = 1.0f / (1.0f + expf(-v));
    return dy * s * (1.0f + v * (1.0f - s));
  }
};
struct HardSwishF {  // x·min(max(x+3, 0), 6)/6; the gradient reads x (PyTorch's hardswish_backward)
  // the clamp as comparisons, not fmaxf/fminf, which GCC calls out of line (their NaN rule) instead
  // of vectorising: the same value for every input (a NaN's x+3 clamps to 0 either way; x+3 is
  // never -0)
  CNNC_INLINE float f(float v) {
    float t = v + 3.0f;
    t = t > 0.0f ? t : 0.0f;
    t = t < 6.0f ? t : 6.0f;
    return v * t / 6.0f;
  }
  CNNC_INLINE float g(float dy, float v) { return v < -3.0f ? 0.0f : (v <= 3.0f ? dy * (v / 3.0f + 0.5f) : dy); }
};
struct NoActF {  // batch norm with no activation folded in (BNApply, BNGrad)
  CNNC_INLINE float f(float v) { return v; }
  CNNC_INLINE float g(float dy, float) { return dy; }
};
// Global average pooling: E has N (the pool's outputs, B·C; the gradient's: its B·C·H·W
// elements), HW (a channel's map) and, forward, OUTS (outputs per task: about CHUNK elements read).
template <class E>
struct GlobalAvgPool {  // x, out: out[b,c] = the mean of x[b,c,:,:], summed in order
  static constexpr long tasks = cdiv(E::N, E::OUTS), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* x = arg<const float>(p, 0);
    float* out = arg<float>(p, 1);
    const long lo = task * E::OUTS, hi = cmin(static_cast<long>(E::N), lo + E::OUTS);
    for (long i = lo; i < hi; i++) {
      const float* m = x + i * E::HW;
      float s = 0.0f;
      for (long q = 0; q < E::HW; q++) s += m[q];
      out[i] = s / static_cast<float>(E::HW);
    }
  }
};
template <class E>
struct GlobalAvgPoolGrad {  // dy, dx: dx[b,c,h,w] = dy[b,c]/HW
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* dy = arg<const float>(p, 0);
    float* dx = arg<float>(p, 1);
    CNNC_RANGE(E::N);
    for (long i = lo; i < hi; i++) dx[i] = dy[i / E::HW] / static_cast<float>(E::HW);
  }
};

// Concat along channels: one launch per input copies its samples (PER elements each) into
// elements [FIRST, FIRST+PER) of the output's samples (ALL elements each); the gradient copies
// such a slice of dy back out. E has N (B·PER), PER, ALL, FIRST.
template <class E>
struct ConcatPart {  // in, out
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* in = arg<const float>(p, 0);
    float* out = arg<float>(p, 1);
    CNNC_RANGE(E::N);
    for (long i = lo; i < hi; i++) out[(i / E::PER) * E::ALL + E::FIRST + i % E::PER] = in[i];
  }
};
template <class E>
struct ConcatGrad {  // dy, dx
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* dy = arg<const float>(p, 0);
    float* dx = arg<float>(p, 1);
    CNNC_RANGE(E::N);
    for (long i = lo; i < hi; i++) dx[i] = dy[(i / E::PER) * E::ALL + E::FIRST + i % E::PER];
  }
};

// Batch norm (templates/batchnorm.cu.tmpl's formulas; compiler/ops/batchnorm.go). Tensors are
// [B,C,S] (S = H·W for maps, 1 for features); only the first `valid` samples (the step's scalar
// block) are real. The statistics and the gradient run one task per channel, every sum over the
// channel's valid values in order, in double (n·S values may be many: 32 samples of 32x32 maps
// are 32,768). G has B, C, S and, for the statistics, EPS and MOM.
template <class G>
CNNC_INLINE long bnValid(const uint64_t* p, int i) {
  long valid = argscalars(p, i).valid;
  return valid < 1 || valid > G::B ? G::B : valid;
}
template <class G>
struct BNStats {  // x, running_mean, running_var, num_batches_tracked, mean, invstd, scalars
  static constexpr long tasks = G::C, scratch = 0;
  static void run(const uint64_t* p, int64_t c, float*) {
    const float* x = arg<const float>(p, 0);
    float* rmean = arg<float>(p, 1);
    float* rvar = arg<float>(p, 2);
    int64_t* tracked = arg<int64_t>(p, 3);
    float* mean = arg<float>(p, 4);
    float* invstd = arg<float>(p, 5);
    const long valid = bnValid<G>(p, 6), n = valid * G::S;
    double s = 0.0;
    for (long b = 0; b < valid; b++)
      for (long q = 0; q < G::S; q++) s += x[(b * G::C + c) * G::S + q];
    const float mu = static_cast<float>(s / static_cast<double>(n));
    double v = 0.0;
    for (long b = 0; b < valid; b++)
      for (long q = 0; q < G::S; q++) {
        const double d = static_cast<double>(x[(b * G::C + c) * G::S + q]) - mu;
        v += d * d;
      }
    const float var = static_cast<float>(v / static_cast<double>(n));
    mean[c] = mu;
    invstd[c] = 1.0f / sqrtf(var + G::EPS);
    const float unbiased = n > 1 ? var * (static_cast<float>(n) / static_cast<float>(n - 1)) : var;
    rmean[c] = (1.0f - G::MOM) * rmean[c] + G::MOM * mu;
    rvar[c] = (1.0f - G::MOM) * rvar[c] + G::MOM * unbiased;
    if (c == 0) tracked[0] += 1;
  }
};
// A conv block's batch norm statistics partials (compiler/ops BNPartialsType; the conv's second
// output, Attrs.BNStats), flat-tiled: per chunk q of CHUNK consecutive values of channel c's
// batch-major B·S and channel c, the chunk's valid values' mean and M2 = Σ(v - mean)² (two passes)
// at part[(q·C + c)·2 + {0, 1}], (0, 0) for a chunk without a valid value; task 0 zeroes the
// buffer's floats past the chunks (ELEMS in all). One task per channel, a fixed order.
template <class G>
struct BNPartials {  // y, part, scalars
  static constexpr long tasks = G::C, scratch = 0;
  static void run(const uint64_t* p, int64_t c, float*) {
    const float* y = arg<const float>(p, 0);
    float* part = arg<float>(p, 1);
    const long valid = bnValid<G>(p, 2), n = valid * G::S;
    constexpr long chunks = (G::B * G::S + G::CHUNK - 1) / G::CHUNK;
    for (long q = 0; q < chunks; q++) {
      const long lo = q * G::CHUNK, hi = n < lo + G::CHUNK ? n : lo + G::CHUNK;
      const auto at = [&](long j) { return y[((j / G::S) * G::C + c) * G::S + j % G::S]; };
      float s = 0.0f;
      for (long j = lo; j < hi; j++) s += at(j);
      const float mu = hi > lo ? s / static_cast<float>(hi - lo) : 0.0f;
      float m2 = 0.0f;
      for (long j = lo; j < hi; j++) {
        const float d = at(j) - mu;
        m2 += d * d;
      }
      part[(q * G::C + c) * 2] = mu;
      part[(q * G::C + c) * 2 + 1] = m2;
    }
    if (c == 0)
      for (long e = chunks * G::C * 2; e < G::ELEMS; e++) part[e] = 0.0f;
  }
};
template <class G>
struct BNStatsEval {  // the same parameters: mean, invstd from the running statistics; nothing changes
  static constexpr long tasks = 1, scratch = 0;
  static void run(const uint64_t* p, int64_t, float*) {
    const float* rmean = arg<const float>(p, 1);
    const float* rvar = arg<const float>(p, 2);
    float* mean = arg<float>(p, 4);
    float* invstd = arg<float>(p, 5);
    for (long c = 0; c < G::C; c++) {
      mean[c] = rmean[c];
      invstd[c] = 1.0f / sqrtf(rvar[c] + G::EPS);
    }
  }
};
// BNGrad's dy with no max-pool folded into the normalisation: read where it is.
struct NoPoolR {
  static constexpr bool on = false;
  CNNC_INLINE float dy(const float* dy, const uint32_t*, long i) { return dy[i]; }
};
// dx = invstd·(g - Σg/n - x̂·Σ(g·x̂)/n), g = dy·weight, x̂ = (x-mean)·invstd, 0 for the padding;
// affine: dweight = Σ dy·x̂, dbias = Σ dy. ACT (an activation F folded into the normalisation,
// compiler/ops Attrs.Act): dy is first F's gradient at z = x̂[·weight + bias], recomputed as
// BNApply computes it — F::g(dy, z), or F::g(dy, F::f(z)) with YSAVE (the gradient reads the
// output) — and the bias is a parameter after the weight. R routes dy: NoPoolR, or PoolR (a
// max-pool folded in, Attrs.Pool: dy is the pooled output's gradient, and the packed argmax a
// parameter before dx).
template <class G, class F = NoActF, class R = NoPoolR>
struct BNGrad {  // dy, x, mean, invstd, [weight, [bias,]] [argmax,] dx, [dweight, dbias,] scalars
  static constexpr long tasks = G::C, scratch = 0;
  static void run(const uint64_t* p, int64_t c, float*) {
    const float* dy0 = arg<const float>(p, 0);
    const float* x = arg<const float>(p, 1);
    const float mu = arg<const float>(p, 2)[c], is = arg<const float>(p, 3)[c];
    constexpr int na = (G::AFFINE ? 5 : 4) + (G::AFFINE && G::ACT ? 1 : 0);  // the argmax's parameter (R::on)
    constexpr int k = na + (R::on ? 1 : 0);                                 // dx's parameter
    const uint32_t* am = R::on ? arg<const uint32_t>(p, na) : nullptr;
    const float w = G::AFFINE ? arg<const float>(p, 4)[c] : 1.0f;
    const float bias = G::AFFINE && G::ACT ? arg<const float>(p, 5)[c] : 0.0f;
    const auto dy = [&](long i) {
      if constexpr (!G::ACT) {
        return R::dy(dy0, am, i);
      } else {
        const float z = G::AFFINE ? (x[i] - mu) * is * w + bias : (x[i] - mu) * is;
        return F::g(R::dy(dy0, am, i), G::YSAVE ? F::f(z) : z);
      }
    };
    float* dx = arg<float>(p, k);
    const long valid = bnValid<G>(p, k + (G::AFFINE ? 3 : 1)), n = valid * G::S;
    double sdy = 0.0, sdyx = 0.0;
    for (long b = 0; b < valid; b++)
      for (long q = 0; q < G::S; q++) {
        const long i = (b * G::C + c) * G::S + q;
        const float d = dy(i);
        sdy += d;
        sdyx += static_cast<double>(d) * ((x[i] - mu) * is);
      }
    const float sumDy = static_cast<float>(sdy), sumDyX = static_cast<float>(sdyx);
    const float meanG = w * sumDy / static_cast<float>(n), meanGX = w * sumDyX / static_cast<float>(n);
    for (long b = 0; b < G::B; b++)
      for (long q = 0; q < G::S; q++) {
        const long i = (b * G::C + c) * G::S + q;
        dx[i] = b < valid ? is * (dy(i) * w - meanG - (x[i] - mu) * is * meanGX) : 0.0f;
      }
    if constexpr (G::AFFINE) {
      arg<float>(p, k + 1)[c] = sumDyX;
      arg<float>(p, k + 2)[c] = sumDy;
    }
  }
};
template <class E, class F = NoActF>
struct BNApply {  // x, mean, invstd, [weight, bias,] out: (x - mean)·invstd[·weight + bias], then max(·, 0) with
                  // RELU (the ReLU after the batch norm, folded in: ReLU's formula), or F::f, the
                  // activation folded in (out may be x)
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* x = arg<const float>(p, 0);
    const float* mean = arg<const float>(p, 1);
    const float* invstd = arg<const float>(p, 2);
    float* out = arg<float>(p, E::AFFINE ? 5 : 3);
    CNNC_RANGE(E::N);
    for (long i = lo; i < hi; i++) {
      const long c = (i / E::S) % E::C;
      float v;
      if constexpr (E::AFFINE) {
        v = (x[i] - mean[c]) * invstd[c] * arg<const float>(p, 3)[c] + arg<const float>(p, 4)[c];
      } else {
        v = (x[i] - mean[c]) * invstd[c];
      }
      if constexpr (E::RELU) v = v > 0.0f ? v : 0.0f;
      out[i] = F::f(v);
    }
  }
};

template <class E>
struct FillZero {  // N 32-bit words
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    uint32_t* out = arg<uint32_t>(p, 0);
    CNNC_RANGE(E::N);
    memset(out + lo, 0, sizeof(uint32_t) * (hi - lo));
  }
};
// out[0..n) = in[0..n) · coef, each product rounded to float: not inlined, so that no product is
// contracted into an FMA with the update's arithmetic (torch's clip_grad_norm_ rounds it, and a
// coefficient of 1 then changes no bit).
__attribute__((noipa)) static void clip_scale(float* out, const float* in, float coef, long n) {
  for (long i = 0; i < n; i++) out[i] = in[i] * coef;
}

// The update runs on elements [first, end) of the tensor only (the last two arguments; [0, N)
// unless a sharded optimizer gives a rank a range): param and grad hold the whole tensor, the
// states elements first.. on (a rank keeps its range's state only). Every element takes the
// arithmetic it takes in the whole update; a range starting at a multiple of the vector width
// also takes the same vector or scalar path (tasks keep their CHUNK boundaries).
template <class E, class O>
struct Update {  // sgd_update / adam_update: param, grad, states..., [clip coefficient,] the step's scalars, first, end
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static constexpr long RUN = 1024;  // with clipping: gradients scaled a run at a time
  static void run(const uint64_t* p, int64_t task, float*) {
    constexpr int NS = opt_states<O>();
    constexpr int SC = 2 + NS + (E::CLIP ? 1 : 0);
    const long first = argi(p, SC + 1), end = argi(p, SC + 2);
    float* param = arg<float>(p, 0);
    const float* grad = arg<const float>(p, 1);
    // indexed by the tensor's element: valid from first on
    float* s0 = NS > 0 ? arg<float>(p, 2) - first : nullptr;
    float* s1 = NS > 1 ? arg<float>(p, 3) - first : nullptr;
    const CnncStepScalars& sc = argscalars(p, SC);
    const OptRun<O> run(sc.lr, sc.step);
    const long lo = cmax(task * CHUNK, first);
    const long hi = cmin(cmin(static_cast<long>(E::N), task * CHUNK + CHUNK), end);
    if (lo >= hi) return;
    if constexpr (E::CLIP) {
      // torch's clip_grad_norm_ multiplies the gradients (rounding) before the step
      const float coef = *arg<const float>(p, 2 + NS);
      alignas(64) float g[RUN];
      for (long a = lo; a < hi; a += RUN) {
        const long n = cmin(RUN, hi - a);
        clip_scale(g, grad + a, coef, n);
        opt_range<O>(run, g, param + a, s0 ? s0 + a : nullptr, s1 ? s1 + a : nullptr, n);
      }
    } else {
      opt_range<O>(run, grad + lo, param + lo, s0 ? s0 + lo : nullptr, s1 ? s1 + lo : nullptr, hi - lo);
    }
  }
};

// Gradient clipping (clip_grad_norm, templates/clip.cu.tmpl): E has NG gradients of SIZES[k]
// elements, TOTAL in all. ClipNormPartial: task t sums the squares of elements [t·CHUNK,
// (t+1)·CHUNK) of the gradients laid end to end, in double, in four interleaved sums added in a
// fixed order, into partials[t] (parameter NG); ClipNormCoef adds the partials in task order and
// writes min(1, MAX_NORM/(sqrt(sum) + 1e-6)) (a NaN stays NaN, as torch.clamp).
template <class E>
struct ClipNormPartial {
  static constexpr long tasks = cdiv(E::TOTAL, E::CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const long lo = task * E::CHUNK, hi = cmin(E::TOTAL, lo + E::CHUNK);
    double s[4] = {0.0, 0.0, 0.0, 0.0};
    long off = 0;
    for (int k = 0; k < E::NG; k++) {
      const float* g = arg<const float>(p, k);
      const long a = cmax(lo, off), b = cmin(hi, off + E::SIZES[k]);
      for (long i = a; i < b; i++) {
        const double x = static_cast<double>(g[i - off]);
        s[i & 3] += x * x;
      }
      off += E::SIZES[k];
    }
    arg<double>(p, E::NG)[task] = (s[0] + s[1]) + (s[2] + s[3]);
  }
};
template <class E>
struct ClipNormCoef {  // partials (double), the coefficient (one float)
  static constexpr long tasks = 1, scratch = 0;
  static void run(const uint64_t* p, int64_t, float*) {
    const double* partials = arg<const double>(p, 0);
    double s = 0.0;
    for (long t = 0; t < E::PARTIALS; t++) s += partials[t];
    const double c = E::MAX_NORM / (sqrt(s) + 1e-6);
    *arg<float>(p, 1) = static_cast<float>(c > 1.0 ? 1.0 : c);
  }
};

// dropout forward and gradient: element i kept when the Philox word of counter (g lo, g hi, step,
// STREAM), g = first + i, key (seed lo, seed hi) is at least THRESHOLD; kept ones scaled by SCALE.
template <class E>
struct Dropout {
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* in = arg<const float>(p, 0);
    float* out = arg<float>(p, 1);
    const CnncStepScalars& sc = argscalars(p, 2);
    const uint64_t seed = sc.seed;
    const long step = sc.step, first = argi(p, 3);
    CNNC_RANGE(E::N);
    for (long i = lo; i < hi; i++) {
      const uint64_t g = static_cast<uint64_t>(first + i);
      const uint32_t r = philox_word0(static_cast<uint32_t>(g), static_cast<uint32_t>(g >> 32), static_cast<uint32_t>(step), E::STREAM,
                                      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
      out[i] = static_cast<uint64_t>(r) >= E::THRESHOLD ? in[i] * E::SCALE : 0.0f;
    }
  }
};

// Standalone pools (templates/pool.cu.tmpl): P has B, C, H, W, PHO, PWO, KH, KW, SH, SW, PH, PW, N
// (elements the tasks cover: outputs forward, inputs backward).
template <class P>
struct MaxPoolFwd {
  static constexpr long tasks = cdiv(P::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* x = arg<const float>(p, 0);
    float* y = arg<float>(p, 1);
    CNNC_RANGE(P::N);
    for (long i = lo; i < hi; i++) {
      const long px = i % P::PWO, py = i / P::PWO % P::PHO;
      const float* xp = x + i / (P::PHO * P::PWO) * (P::H * P::W);
      float best = 0.0f;
      bool found = false;
      for (long ky = 0; ky < P::KH; ky++) {
        const long iy = py * P::SH - P::PH + ky;
        if (iy < 0 || iy >= P::H) continue;
        for (long kx = 0; kx < P::KW; kx++) {
          const long ix = px * P::SW - P::PW + kx;
          if (ix < 0 || ix >= P::W) continue;
          const float v = xp[iy * P::W + ix];
          if (!found || v > best) {
            best = v;
            found = true;
          }
        }
      }
      y[i] = best;
    }
  }
};
template <class P>
CNNC_INLINE void pool_windows_of(long iy, long ix, long& pyLo, long& pyHi, long& pxLo, long& pxHi) {
  pyLo = iy + P::PH - P::KH + 1 > 0 ? (iy + P::PH - P::KH + P::SH) / P::SH : 0;
  pyHi = cmin((iy + P::PH) / P::SH, P::PHO - 1);
  pxLo = ix + P::PW - P::KW + 1 > 0 ? (ix + P::PW - P::KW + P::SW) / P::SW : 0;
  pxHi = cmin((ix + P::PW) / P::SW, P::PWO - 1);
}
// A max-pool folded into a batch norm (compiler/ops Attrs.Pool), BNGrad's R: position i's
// gradient is the sum of the pooled dy over the windows whose packed argmax names it (P has H, W,
// PHO, PWO, KH, KW, SH, SW, PH, PW and the argmax's BITS).
template <class P>
struct PoolR {
  static constexpr bool on = true;
  CNNC_INLINE float dy(const float* dy, const uint32_t* am, long i) {
    const long ix = i % P::W, iy = i / P::W % P::H, plane = i / (P::H * P::W);
    long pyLo, pyHi, pxLo, pxHi;
    pool_windows_of<P>(iy, ix, pyLo, pyHi, pxLo, pxHi);
    float s = 0.0f;
    for (long py = pyLo; py <= pyHi; py++)
      for (long px = pxLo; px <= pxHi; px++) {
        const long o = (plane * P::PHO + py) * P::PWO + px;
        const long k = get_argmax<P::BITS>(am, o);
        if (py * P::SH - P::PH + k / P::KW == iy && px * P::SW - P::PW + k % P::KW == ix) s += dy[o];
      }
    return s;
  }
};
// A batch norm with the max-pool after it folded in (compiler/ops Attrs.Pool): per pooled output
// (N of them, E also has C, AFFINE, RELU, ARGMAX, BITS and the pool's geometry as PoolR's), its
// window's values normalised as BNApply computes them, their maximum (the first in scan order on
// ties) and, with ARGMAX, its window index packed into the argmax (a task's CHUNK outputs fill
// whole words). The full-resolution normalised values are never stored.
template <class E, class F = NoActF>
struct BNApplyPool {  // x, mean, invstd, [weight, bias,] out, [argmax]
  static constexpr long tasks = cdiv(E::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* x = arg<const float>(p, 0);
    const float* mean = arg<const float>(p, 1);
    const float* invstd = arg<const float>(p, 2);
    float* out = arg<float>(p, E::AFFINE ? 5 : 3);
    uint32_t* am = E::ARGMAX ? arg<uint32_t>(p, E::AFFINE ? 6 : 4) : nullptr;
    CNNC_RANGE(E::N);
    uint32_t word = 0;
    for (long o = lo; o < hi; o++) {
      const long px = o % E::PWO, py = o / E::PWO % E::PHO, plane = o / (E::PHO * E::PWO), c = plane % E::C;
      const float mu = mean[c], is = invstd[c];
      const float w = E::AFFINE ? arg<const float>(p, 3)[c] : 1.0f, b = E::AFFINE ? arg<const float>(p, 4)[c] : 0.0f;
      const float* xp = x + plane * E::H * E::W;
      float best = 0.0f;
      long at = -1;
      for (long ky = 0; ky < E::KH; ky++) {
        const long iy = py * E::SH - E::PH + ky;
        if (iy < 0 || iy >= E::H) continue;
        for (long kx = 0; kx < E::KW; kx++) {
          const long ix = px * E::SW - E::PW + kx;
          if (ix < 0 || ix >= E::W) continue;
          float v;
          if constexpr (E::AFFINE) {
            v = (xp[iy * E::W + ix] - mu) * is * w + b;
          } else {
            v = (xp[iy * E::W + ix] - mu) * is;
          }
          if constexpr (E::RELU) v = v > 0.0f ? v : 0.0f;
          v = F::f(v);
          if (at < 0 || v > best) {
            best = v;
            at = ky * E::KW + kx;
          }
        }
      }
      out[o] = best;
      if constexpr (E::ARGMAX) {
        // the task's outputs start a word (CHUNK is a multiple of 32/BITS): whole words, no atomics
        constexpr long PER = 32 / E::BITS;
        word = (o % PER == 0 ? 0u : word) | static_cast<uint32_t>(at) << (o % PER * E::BITS);
        if (o % PER == PER - 1 || o == hi - 1) am[o / PER] = word;
      }
    }
    (void)am;
    (void)word;
  }
};
template <class P>
struct MaxPoolGrad {  // dy, x, dx
  static constexpr long tasks = cdiv(P::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* dy = arg<const float>(p, 0);
    const float* x = arg<const float>(p, 1);
    float* dx = arg<float>(p, 2);
    CNNC_RANGE(P::N);
    for (long i = lo; i < hi; i++) {
      const long ix = i % P::W, iy = i / P::W % P::H, plane = i / (P::H * P::W);
      const float* xp = x + plane * P::H * P::W;
      const float* dyp = dy + plane * P::PHO * P::PWO;
      long pyLo, pyHi, pxLo, pxHi;
      pool_windows_of<P>(iy, ix, pyLo, pyHi, pxLo, pxHi);
      float sum = 0.0f;
      for (long py = pyLo; py <= pyHi; py++)
        for (long px = pxLo; px <= pxHi; px++) {
          float best = 0.0f;
          long at = -1;
          for (long ky = 0; ky < P::KH; ky++) {
            const long wy = py * P::SH - P::PH + ky;
            if (wy < 0 || wy >= P::H) continue;
            for (long kx = 0; kx < P::KW; kx++) {
              const long wx = px * P::SW - P::PW + kx;
              if (wx < 0 || wx >= P::W) continue;
              const float v = xp[wy * P::W + wx];
              if (at < 0 || v > best) {
                best = v;
                at = wy * P::W + wx;
              }
            }
          }
          if (at == iy * P::W + ix) sum += dyp[py * P::PWO + px];
        }
      dx[i] = sum;
    }
  }
};
template <class P>
struct AvgPoolFwd {
  static constexpr long tasks = cdiv(P::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* x = arg<const float>(p, 0);
    float* y = arg<float>(p, 1);
    CNNC_RANGE(P::N);
    for (long i = lo; i < hi; i++) {
      const long px = i % P::PWO, py = i / P::PWO % P::PHO;
      const float* xp = x + i / (P::PHO * P::PWO) * (P::H * P::W);
      float sum = 0.0f;
      for (long ky = 0; ky < P::KH; ky++) {
        const long iy = py * P::SH - P::PH + ky;
        if (iy < 0 || iy >= P::H) continue;
        for (long kx = 0; kx < P::KW; kx++) {
          const long ix = px * P::SW - P::PW + kx;
          if (ix >= 0 && ix < P::W) sum += xp[iy * P::W + ix];
        }
      }
      y[i] = sum / static_cast<float>(P::KH * P::KW);
    }
  }
};
template <class P>
struct AvgPoolGrad {  // dy, dx
  static constexpr long tasks = cdiv(P::N, CHUNK), scratch = 0;
  static void run(const uint64_t* p, int64_t task, float*) {
    const float* dy = arg<const float>(p, 0);
    float* dx = arg<float>(p, 1);
    CNNC_RANGE(P::N);
    for (long i = lo; i < hi; i++) {
      const long ix = i % P::W, iy = i / P::W % P::H;
      const float* dyp = dy + i / (P::H * P::W) * (P::PHO * P::PWO);
      long pyLo, pyHi, pxLo, pxHi;
      pool_windows_of<P>(iy, ix, pyLo, pyHi, pxLo, pxHi);
      float sum = 0.0f;
      for (long py = pyLo; py <= pyHi; py++)
        for (long px = pxLo; px <= pxHi; px++) sum += dyp[py * P::PWO + px];
      dx[i] = sum / static_cast<float>(P::KH * P::KW);
    }
  }
};
#undef CNNC_RANGE

// No optimizer: a weight-gradient kernel that writes (or adds) its gradients.
struct NoOpt {
  static constexpr int KIND = -1;
  static constexpr bool HAS_WD = false, HAS_MOM = false, NESTEROV = false;
  static constexpr float WD = 0, MOM = 0, B1 = 0, B2 = 0, OMB1 = 0, OMB2 = 0, EPS = 0;
  static constexpr double B1D = 0, B2D = 0;
};

#endif  // CNNC_VW
