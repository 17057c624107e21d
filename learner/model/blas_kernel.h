// Which OpenBLAS kernel this process multiplies matrices with, and a better one when OpenBLAS chose one below what
// the CPU can run.
//
// Debian's OpenBLAS (built DYNAMIC_ARCH) picks its kernel from cpuid when the library loads, and a CPU model it does
// not know (a Xeon newer than the library) gets PRESCOTT's SSE3 kernels: 2-2.5x slower than the AVX2 or AVX-512
// ones the CPU can run, in every product LibTorch and numpy make. The kernel can only be changed before the library
// loads (OPENBLAS_CORETYPE), so the choice is made at the start of main, before any other thread:
//
//   read the loaded kernel (openblas_get_corename) and the CPU's vectors (cpuid, and xgetbv for what the OS saves)
//     -> plan: the kernels better than the loaded one that the CPU can run, best first (PlanBlasKernel)
//     -> probe each in a child process of this program started with OPENBLAS_CORETYPE set: products of the shapes
//        the farm uses against a float64 reference, and its speed; a crash, a hang (kProbeTimeoutSeconds), a kernel
//        the build lacks, a wrong product or a slower kernel rejects it (ChooseBlasKernel)
//     -> start this program again, once, with the first that passed (execv: same pid, same arguments), the choice
//        and its reasons in FARM_BLAS_CHOSEN so that the new process and the processes it starts do not probe again.
//
// The environment it reads: OPENBLAS_CORETYPE set by the user is kept as given (checked, and a failed check is
// warned of); FARM_BLAS_AUTO=0 leaves OpenBLAS as it loaded; FARM_BLAS_EMULATE_FALLBACK=1 treats OPENBLAS_CORETYPE
// as OpenBLAS's own choice, to reproduce on any x86 machine the fallback of a CPU OpenBLAS does not know
// (OPENBLAS_CORETYPE=Prescott FARM_BLAS_EMULATE_FALLBACK=1). A BLAS that is not OpenBLAS (MKL in CUDA builds of
// LibTorch) is left alone. Not thread-safe: call from main before starting threads.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace farm {

// What the CPU offers and the OS saves (x86 cpuid leaves 1 and 7, XCR0); all false elsewhere.
struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  int family = 0;      // display family and model, as /proc/cpuinfo shows them
  int model = 0;
  bool avx = false, fma = false, avx2 = false;
  bool avx512f = false, avx512cd = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool os_ymm = false;  // XCR0 saves the SSE and AVX state
  bool os_zmm = false;  // XCR0 saves the opmask and ZMM state too
};
CpuFeatures ReadCpuFeatures();

// The widest vectors a kernel uses or a CPU can run: the rungs of the ladder kernels are chosen on.
enum class SimdLevel { kBaseline = 0, kAvx = 1, kAvx2 = 2, kAvx512 = 3 };
SimdLevel CpuLevel(const CpuFeatures& cpu);
// The level of an OpenBLAS x86-64 kernel by its name as openblas_get_corename gives it (any case); none for a name
// not known here.
std::optional<SimdLevel> KernelLevel(std::string_view kernel);
const char* LevelName(SimdLevel level);

// The kernels to try instead of the loaded one, best first; none: keep the loaded one.
struct BlasKernelPlan {
  std::vector<std::string> candidates;
  std::string reason;  // for the log: why these, or why none
};
// loaded: the kernel OpenBLAS chose; loaded_checked: whether it passed the products' check in this process. A
// kernel that passed is replaced only by a wider one the CPU can run (SkylakeX, then Haswell or, on AMD, Zen then
// Haswell, then Sandybridge); one that failed, by every narrower one down to Prescott.
BlasKernelPlan PlanBlasKernel(const CpuFeatures& cpu, std::string_view loaded, bool loaded_checked);

// One kernel tried in a child process.
struct KernelProbe {
  enum class Result { kOk, kWrongProduct, kCrashed, kNotInBuild, kSlower };
  std::string kernel;
  Result result = Result::kCrashed;
  double gflops = 0;   // single-thread fp32 product speed, where it ran to the end
  std::string detail;  // what failed: the product and its error, the signal, the kernel that loaded instead
};
const char* ProbeResultName(KernelProbe::Result result);

// A candidate is slower when its speed is under this fraction of the loaded kernel's (timing noise stays above).
inline constexpr double kMinSpeedRatio = 0.9;

struct BlasKernelChoice {
  std::string kernel;               // the kernel to start again with; empty: keep the loaded one
  std::vector<KernelProbe> tried;   // in the order tried
  std::string message;              // for the log: which kernel runs, why, and what was tried
};
// Tries plan's candidates in order with probe, which reports a kernel's result as run elsewhere (a child process;
// a stand-in in tests); a candidate that runs right is rejected as kSlower under kMinSpeedRatio x loaded_gflops
// (0 or less: no speed test). The first that passes is chosen.
BlasKernelChoice ChooseBlasKernel(const BlasKernelPlan& plan, std::string_view loaded, double loaded_gflops,
                                  const std::function<KernelProbe(const std::string& kernel)>& probe);

// This program started again in probe mode with OPENBLAS_CORETYPE=kernel (the probe ChooseBlasKernel is given): a
// crash or hang of the kernel ends only that child.
KernelProbe ProbeKernelInChild(const std::string& kernel);

// Fortran sgemm_ (column-major), as every BLAS exports it.
using SgemmFn = void (*)(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                         const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                         const float* beta, float* c, const int* ldc);
// The process's sgemm_ (LibTorch's BLAS); null where none is loaded.
SgemmFn LoadedSgemm();
// Products of the shapes the farm multiplies (skinny acting batches, square layers, transposed operands as the
// backward pass has them, a matrix-vector case, odd sizes that reach the kernels' edge code) against a float64
// reference, within a bound set by the float32 rounding of each dot product. Empty when right; otherwise the first
// wrong product, its shape and its error.
std::string CheckSgemm(SgemmFn sgemm);
// Single-thread fp32 GFLOP/s of square products of size n: the best of several short timings.
double TimeSgemm(SgemmFn sgemm, int n);

// The loaded BLAS library (the first mapped file whose name holds "blas" or "mkl") and OpenBLAS's kernel (empty when
// the BLAS is not OpenBLAS), for summary.json and the benchmarks.
struct BlasInfo {
  std::string library;
  std::string kernel;
};
BlasInfo LoadedBlasInfo();

// Called first in main. In a probe child (FARM_BLAS_PROBE set) it runs the probe, prints the result and exits. When
// a better kernel passes its probe it starts this program again (execv of /proc/self/exe with argv) and does not
// return; otherwise it returns the line for the log (the kernel that runs, why, and what was tried), a warning when
// a product was wrong or the choice could not be applied.
struct BlasKernelStart {
  std::string message;
  bool warning = false;
};
BlasKernelStart StartWithBestBlasKernel(char** argv);

// The variables that make another process of this machine run the kernel this one runs without checking again
// (OPENBLAS_CORETYPE where it is set, FARM_BLAS_CHOSEN with this process's decision), one NAME=value line each,
// for the launcher to export to the learner and the workers (numpy in Python workers loads the same OpenBLAS).
// Empty where the BLAS is not OpenBLAS. Call after StartWithBestBlasKernel.
std::string BlasKernelEnvironment();

// For a test binary's main: in a probe child it runs the probe and exits; otherwise it returns at once.
void RunBlasProbeIfAsked();

}  // namespace farm
