// The OpenBLAS kernel check and choice (learner/model/blas_kernel.h).
#include "learner/model/blas_kernel.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

// OpenBLAS's functions, resolved at load time when the process has them, null otherwise. sgemm_ is looked up at
// run time instead (LoadedSgemm): a CUDA LibTorch's own libraries reference it, and the link of a weak reference
// that a library also needs then fails where that library's BLAS is not installed (the CUDA compile check).
extern "C" char* openblas_get_corename(void) __attribute__((weak));
extern "C" int openblas_get_num_threads(void) __attribute__((weak));
extern "C" void openblas_set_num_threads(int num_threads) __attribute__((weak));

extern char** environ;

namespace farm {
namespace {

constexpr const char* kCoreType = "OPENBLAS_CORETYPE";
constexpr const char* kChosen = "FARM_BLAS_CHOSEN";
constexpr const char* kProbe = "FARM_BLAS_PROBE";
constexpr const char* kAuto = "FARM_BLAS_AUTO";
constexpr const char* kEmulate = "FARM_BLAS_EMULATE_FALLBACK";
// A probe child that has not reported by then is killed (a kernel that hangs): SIGALRM, set in the child.
constexpr unsigned kProbeTimeoutSeconds = 20;
// The square size of the speed test: large enough for the kernels' inner loops to dominate, small enough to take
// tens of milliseconds on the slowest kernel.
constexpr int kTimedSize = 256;

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

bool SameKernel(std::string_view a, std::string_view b) { return Lower(a) == Lower(b); }

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// The kernels tried at each level, best first. Zen's kernels are Haswell's with AMD's blocking sizes.
std::vector<std::string> Rung(SimdLevel level, const CpuFeatures& cpu) {
  switch (level) {
    case SimdLevel::kAvx512: return {"SkylakeX"};
    case SimdLevel::kAvx2:
      if (cpu.vendor == "AuthenticAMD") return {"Zen", "Haswell"};
      return {"Haswell"};
    case SimdLevel::kAvx: return {"Sandybridge"};
    case SimdLevel::kBaseline: return {"Prescott"};
  }
  return {};
}

std::string CpuText(const CpuFeatures& cpu) {
  return fmt::format("{} family {} model {}, {}", cpu.vendor.empty() ? "CPU" : cpu.vendor, cpu.family, cpu.model,
                     LevelName(CpuLevel(cpu)));
}

std::string Tried(const std::vector<KernelProbe>& tried) {
  std::string out;
  for (const KernelProbe& p : tried) {
    if (!out.empty()) out += "; ";
    out += fmt::format("{} {}", p.kernel, ProbeResultName(p.result));
    if (p.result == KernelProbe::Result::kOk || p.result == KernelProbe::Result::kSlower)
      out += fmt::format(" ({:.1f} GFLOP/s)", p.gflops);
    if (!p.detail.empty()) out += fmt::format(" ({})", p.detail);
  }
  return out;
}

// Deterministic values in [-1, 1): the check needs no seed from the caller and gives the same products each run.
void Fill(std::vector<float>* v, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : *v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  }
}

template <typename F>
void WithOneBlasThread(F f) {
  const int before = openblas_get_num_threads != nullptr ? openblas_get_num_threads() : 0;
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(1);
  f();
  if (openblas_set_num_threads != nullptr && before > 0) openblas_set_num_threads(before);
}

std::string SignalName(int sig) {
  switch (sig) {
    case SIGILL: return "SIGILL (an instruction this CPU lacks)";
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return fmt::format("signal {}", sig);
  }
}

// What a probe child prints, one "key value" line each.
void RunProbeAndExit() {
  alarm(kProbeTimeoutSeconds);
  std::string kernel = openblas_get_corename != nullptr ? openblas_get_corename() : "";
  const SgemmFn sgemm = LoadedSgemm();
  std::string check = sgemm != nullptr ? CheckSgemm(sgemm) : "no sgemm_ in this process";
  double gflops = 0;
  if (check.empty()) WithOneBlasThread([&] { gflops = TimeSgemm(sgemm, kTimedSize); });
  std::replace(check.begin(), check.end(), '\n', ' ');
  std::printf("kernel %s\ncheck %s\ngflops %.6g\n", kernel.c_str(), check.empty() ? "ok" : check.c_str(), gflops);
  std::fflush(stdout);
  _exit(0);
}

// Everything a child writes to fd until it closes it.
std::string ReadAll(int fd) {
  std::string out;
  char buf[512];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  return out;
}

// How a child ended, where it did not exit with status 0: empty when it did.
std::string ChildFailure(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    return WTERMSIG(status) == SIGALRM ? fmt::format("no answer within {} s", kProbeTimeoutSeconds)
                                       : fmt::format("killed by {}", SignalName(WTERMSIG(status)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return fmt::format("exited with status {} before reporting", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return "";
}

// The loaded kernel's products checked in a forked copy of this process (one thread), so that a kernel that
// crashes (AVX-512 code on a CPU without it: SIGILL) ends only the copy. Empty when right.
std::string CheckLoadedKernel() {
  const SgemmFn sgemm = LoadedSgemm();
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return CheckSgemm(sgemm);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return CheckSgemm(sgemm);
  }
  if (pid == 0) {
    close(fds[0]);
    alarm(kProbeTimeoutSeconds);
    if (openblas_set_num_threads != nullptr) openblas_set_num_threads(1);
    const std::string result = CheckSgemm(sgemm);
    const ssize_t written = write(fds[1], result.data(), result.size());
    _exit(written == static_cast<ssize_t>(result.size()) ? 0 : 1);
  }
  close(fds[1]);
  const std::string result = ReadAll(fds[0]);
  close(fds[0]);
  if (std::string failure = ChildFailure(pid); !failure.empty()) return "the check " + failure;
  return result;
}

}  // namespace

// Its report is read through a pipe.
KernelProbe ProbeKernelInChild(const std::string& kernel) {
  KernelProbe p;
  p.kernel = kernel;
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.rfind("OPENBLAS_CORETYPE=", 0) == 0 || entry.rfind("OPENBLAS_VERBOSE=", 0) == 0 ||
        entry.rfind("FARM_BLAS_", 0) == 0)
      continue;
    env_strings.emplace_back(entry);
  }
  env_strings.push_back(fmt::format("{}={}", kCoreType, kernel));
  env_strings.push_back(fmt::format("{}=1", kProbe));
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string arg0 = "farm-blas-probe";
  char* args[] = {arg0.data(), nullptr};

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    p.detail = fmt::format("pipe: {}", std::strerror(errno));
    return p;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, args, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    p.detail = fmt::format("could not start a probe (posix_spawn: {})", std::strerror(rc));
    return p;
  }
  const std::string out = ReadAll(fds[0]);
  close(fds[0]);
  if (std::string failure = ChildFailure(pid); !failure.empty()) {
    p.detail = failure;
    return p;
  }
  std::string loaded, check;
  double gflops = 0;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const auto space = line.find(' ');
    const std::string key = line.substr(0, space), value = space == std::string::npos ? "" : line.substr(space + 1);
    if (key == "kernel") loaded = value;
    if (key == "check") check = value;
    if (key == "gflops") gflops = std::atof(value.c_str());
  }
  if (check.empty()) {
    p.detail = "exited without a report";
    return p;
  }
  if (!SameKernel(loaded, kernel)) {
    p.result = KernelProbe::Result::kNotInBuild;
    p.detail = fmt::format("this OpenBLAS has no such kernel; it loaded {}", loaded);
    return p;
  }
  if (check != "ok") {
    p.result = KernelProbe::Result::kWrongProduct;
    p.detail = check;
    return p;
  }
  p.result = KernelProbe::Result::kOk;
  p.gflops = gflops;
  return p;
}

SgemmFn LoadedSgemm() {
  static const SgemmFn sgemm = reinterpret_cast<SgemmFn>(dlsym(RTLD_DEFAULT, "sgemm_"));
  return sgemm;
}

CpuFeatures ReadCpuFeatures() {
  CpuFeatures cpu;
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return cpu;
  const unsigned max_leaf = eax;
  char vendor[13] = {};
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  cpu.vendor = vendor;
  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  const int base_family = static_cast<int>((eax >> 8) & 0xf);
  cpu.family = base_family == 0xf ? base_family + static_cast<int>((eax >> 20) & 0xff) : base_family;
  cpu.model = static_cast<int>((eax >> 4) & 0xf);
  if (base_family == 0x6 || base_family == 0xf) cpu.model |= static_cast<int>((eax >> 16) & 0xf) << 4;
  cpu.fma = (ecx >> 12) & 1;
  const bool osxsave = (ecx >> 27) & 1;
  cpu.avx = (ecx >> 28) & 1;
  if (osxsave) {
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    cpu.os_ymm = (xcr0_lo & 0x6) == 0x6;
    cpu.os_zmm = cpu.os_ymm && (xcr0_lo & 0xe0) == 0xe0;
  }
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    cpu.avx2 = (ebx >> 5) & 1;
    cpu.avx512f = (ebx >> 16) & 1;
    cpu.avx512dq = (ebx >> 17) & 1;
    cpu.avx512cd = (ebx >> 28) & 1;
    cpu.avx512bw = (ebx >> 30) & 1;
    cpu.avx512vl = (ebx >> 31) & 1;
  }
#endif
  return cpu;
}

SimdLevel CpuLevel(const CpuFeatures& cpu) {
  const bool avx = cpu.avx && cpu.os_ymm;
  const bool avx2 = avx && cpu.avx2 && cpu.fma;
  // SkylakeX's kernels are built for the Skylake-SP set (F, CD, BW, DQ, VL).
  const bool avx512 = avx2 && cpu.os_zmm && cpu.avx512f && cpu.avx512cd && cpu.avx512bw && cpu.avx512dq &&
                      cpu.avx512vl;
  return avx512 ? SimdLevel::kAvx512 : avx2 ? SimdLevel::kAvx2 : avx ? SimdLevel::kAvx : SimdLevel::kBaseline;
}

std::optional<SimdLevel> KernelLevel(std::string_view kernel) {
  // OpenBLAS's x86 core names (driver/others/dynamic.c), by the widest vectors their kernels use.
  static const std::pair<const char*, SimdLevel> kKernels[] = {
      {"katmai", SimdLevel::kBaseline},      {"coppermine", SimdLevel::kBaseline},
      {"northwood", SimdLevel::kBaseline},   {"prescott", SimdLevel::kBaseline},
      {"banias", SimdLevel::kBaseline},      {"atom", SimdLevel::kBaseline},
      {"core2", SimdLevel::kBaseline},       {"penryn", SimdLevel::kBaseline},
      {"dunnington", SimdLevel::kBaseline},  {"nehalem", SimdLevel::kBaseline},
      {"athlon", SimdLevel::kBaseline},      {"opteron", SimdLevel::kBaseline},
      {"opteron_sse3", SimdLevel::kBaseline}, {"barcelona", SimdLevel::kBaseline},
      {"nano", SimdLevel::kBaseline},        {"bobcat", SimdLevel::kBaseline},
      {"sandybridge", SimdLevel::kAvx},      {"bulldozer", SimdLevel::kAvx},
      {"piledriver", SimdLevel::kAvx},       {"steamroller", SimdLevel::kAvx},
      {"haswell", SimdLevel::kAvx2},         {"excavator", SimdLevel::kAvx2},
      {"zen", SimdLevel::kAvx2},             {"skylakex", SimdLevel::kAvx512},
      {"cooperlake", SimdLevel::kAvx512},    {"sapphirerapids", SimdLevel::kAvx512},
  };
  const std::string name = Lower(kernel);
  for (const auto& [known, level] : kKernels)
    if (name == known) return level;
  return std::nullopt;
}

const char* LevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kBaseline: return "SSE only";
    case SimdLevel::kAvx: return "AVX";
    case SimdLevel::kAvx2: return "AVX2 and FMA";
    case SimdLevel::kAvx512: return "AVX-512";
  }
  return "?";
}

const char* ProbeResultName(KernelProbe::Result result) {
  switch (result) {
    case KernelProbe::Result::kOk: return "right";
    case KernelProbe::Result::kWrongProduct: return "wrong products";
    case KernelProbe::Result::kCrashed: return "failed";
    case KernelProbe::Result::kNotInBuild: return "not in this build";
    case KernelProbe::Result::kSlower: return "slower";
  }
  return "?";
}

BlasKernelPlan PlanBlasKernel(const CpuFeatures& cpu, std::string_view loaded, bool loaded_checked) {
  BlasKernelPlan plan;
  const std::optional<SimdLevel> have = KernelLevel(loaded);
  const SimdLevel can = CpuLevel(cpu);
  if (!have) {
    plan.reason = fmt::format("kernel {} is not one this check knows; the CPU ({}) is left to it", loaded,
                              CpuText(cpu));
    return plan;
  }
  const auto add = [&](SimdLevel level) {
    for (std::string& k : Rung(level, cpu))
      if (!SameKernel(k, loaded)) plan.candidates.push_back(std::move(k));
  };
  if (loaded_checked) {
    if (static_cast<int>(can) <= static_cast<int>(*have)) {
      plan.reason = fmt::format("{} ({}) is as wide as the CPU runs ({})", loaded, LevelName(*have), CpuText(cpu));
      return plan;
    }
    for (int l = static_cast<int>(can); l > static_cast<int>(*have); --l) add(static_cast<SimdLevel>(l));
    plan.reason = fmt::format("OpenBLAS chose {} ({}), below what the CPU runs ({})", loaded, LevelName(*have),
                              CpuText(cpu));
    return plan;
  }
  const int top = std::min(static_cast<int>(can), static_cast<int>(*have));
  for (int l = top; l >= 0; --l) add(static_cast<SimdLevel>(l));
  plan.reason = fmt::format("{} fails the products' check on this CPU ({})", loaded, CpuText(cpu));
  return plan;
}

BlasKernelChoice ChooseBlasKernel(const BlasKernelPlan& plan, std::string_view loaded, double loaded_gflops,
                                  const std::function<KernelProbe(const std::string& kernel)>& probe) {
  BlasKernelChoice choice;
  for (const std::string& kernel : plan.candidates) {
    KernelProbe p = probe(kernel);
    p.kernel = kernel;
    if (p.result == KernelProbe::Result::kOk && loaded_gflops > 0 && p.gflops < kMinSpeedRatio * loaded_gflops) {
      p.result = KernelProbe::Result::kSlower;
      p.detail = fmt::format("{} has {:.1f}", loaded, loaded_gflops);
    }
    choice.tried.push_back(p);
    if (p.result == KernelProbe::Result::kOk) {
      choice.kernel = kernel;
      break;
    }
  }
  const std::string speed = loaded_gflops > 0 ? fmt::format(" ({:.1f} GFLOP/s)", loaded_gflops) : "";
  if (!choice.kernel.empty()) {
    choice.message = fmt::format("BLAS: OpenBLAS kernel {} instead of {}{}: {}; tried {}", choice.kernel, loaded,
                                 speed, plan.reason, Tried(choice.tried));
  } else {
    choice.message = fmt::format("BLAS: OpenBLAS kernel {}{} kept: {}, and no other kernel passed: tried {}", loaded,
                                 speed, plan.reason, choice.tried.empty() ? "none" : Tried(choice.tried));
  }
  return choice;
}

std::string CheckSgemm(SgemmFn sgemm) {
  struct Case {
    char ta, tb;
    int m, n, k;
    float alpha, beta;
    const char* what;
  };
  static const Case kCases[] = {
      {'N', 'N', 256, 64, 64, 1.0f, 0.0f, "square layer, acting batch"},
      {'N', 'N', 1000, 8, 64, 1.0f, 0.0f, "skinny"},
      {'T', 'N', 64, 256, 17, 1.0f, 0.0f, "transposed A"},
      {'N', 'T', 129, 129, 129, 1.0f, 0.0f, "square, transposed B"},
      {'T', 'T', 33, 7, 300, 1.0f, 0.0f, "both transposed, long k"},
      {'N', 'N', 1, 64, 64, 1.0f, 0.0f, "one row"},
      {'N', 'N', 64, 1, 300, 1.0f, 0.0f, "matrix-vector"},
      {'T', 'N', 37, 53, 91, 1.0f, 0.0f, "odd sizes"},
      {'N', 'T', 61, 250, 48, 0.5f, 1.0f, "accumulating (beta 1)"},
  };
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    const int a_rows = c.ta == 'N' ? c.m : c.k, a_cols = c.ta == 'N' ? c.k : c.m;
    const int b_rows = c.tb == 'N' ? c.k : c.n, b_cols = c.tb == 'N' ? c.n : c.k;
    std::vector<float> a(static_cast<size_t>(a_rows) * a_cols), b(static_cast<size_t>(b_rows) * b_cols),
        out(static_cast<size_t>(c.m) * c.n);
    Fill(&a, seed++);
    Fill(&b, seed++);
    Fill(&out, seed++);
    const std::vector<float> before = out;
    sgemm(&c.ta, &c.tb, &c.m, &c.n, &c.k, &c.alpha, a.data(), &a_rows, b.data(), &b_rows, &c.beta, out.data(), &c.m);
    // Column-major: element (i, j) of op(A) is a[i + p * lda] untransposed, a[p + i * lda] transposed.
    const auto at = [](const std::vector<float>& v, char t, int ld, int i, int j) {
      return static_cast<double>(t == 'N' ? v[static_cast<size_t>(i) + static_cast<size_t>(j) * ld]
                                          : v[static_cast<size_t>(j) + static_cast<size_t>(i) * ld]);
    };
    for (int j = 0; j < c.n; ++j) {
      for (int i = 0; i < c.m; ++i) {
        double dot = 0, magnitude = 0;
        for (int p = 0; p < c.k; ++p) {
          const double term = at(a, c.ta, a_rows, i, p) * at(b, c.tb, b_rows, p, j);
          dot += term;
          magnitude += std::fabs(term);
        }
        const size_t idx = static_cast<size_t>(i) + static_cast<size_t>(j) * c.m;
        const double ref = c.alpha * dot + c.beta * before[idx];
        // float32 dot products of length k err by at most about k units in the last place of the sum of |terms|.
        const double bound = (c.k + 2) * std::ldexp(1.0, -23) * (c.alpha * magnitude + std::fabs(c.beta * before[idx]));
        const double err = std::fabs(static_cast<double>(out[idx]) - ref);
        if (!(err <= bound))
          return fmt::format("sgemm {}{} {}x{}x{} ({}): element ({}, {}) is {:.7g}, expected {:.7g} (error {:.3g}, "
                             "bound {:.3g})", c.ta, c.tb, c.m, c.n, c.k, c.what, i, j, out[idx], ref, err, bound);
      }
    }
  }
  return "";
}

double TimeSgemm(SgemmFn sgemm, int n) {
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  Fill(&a, 11);
  Fill(&b, 12);
  const float one = 1.0f, zero = 0.0f;
  const char no = 'N';
  sgemm(&no, &no, &n, &n, &n, &one, a.data(), &n, b.data(), &n, &zero, c.data(), &n);
  constexpr int kProducts = 3, kTrials = 5;
  double best = 0;
  for (int t = 0; t < kTrials; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kProducts; ++i)
      sgemm(&no, &no, &n, &n, &n, &one, a.data(), &n, b.data(), &n, &zero, c.data(), &n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, kProducts * 2.0 * n * n * static_cast<double>(n) / s / 1e9);
  }
  return best;
}

BlasInfo LoadedBlasInfo() {
  BlasInfo info;
  info.library = "none found";
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string name = path.substr(path.rfind('/') + 1);
    if (name.find("blas") != std::string::npos || name.find("mkl") != std::string::npos) {
      info.library = path;
      break;
    }
  }
  if (openblas_get_corename != nullptr) info.kernel = openblas_get_corename();
  return info;
}

void RunBlasProbeIfAsked() {
  if (Env(kProbe) != nullptr) RunProbeAndExit();
}

namespace {

// The decision of StartWithBestBlasKernel in this process; empty where the BLAS is not OpenBLAS.
std::string decision;  // written once, in main before any thread starts

BlasKernelStart Decide(char** argv) {
  if (openblas_get_corename == nullptr || LoadedSgemm() == nullptr)
    return {fmt::format("BLAS: {}, not OpenBLAS: its kernels are left as they are", LoadedBlasInfo().library)};
  const std::string loaded = openblas_get_corename();
  const char* coretype = Env(kCoreType);
  if (const char* chosen = Env(kChosen); chosen != nullptr) {
    // Chosen before this process started: by this program before it started itself again, or by the launcher.
    if (coretype != nullptr && !SameKernel(coretype, loaded))
      return {fmt::format("BLAS: OpenBLAS runs {}, not the {} chosen before this process started ({})", loaded,
                          coretype, chosen), true};
    return {chosen};
  }
  if (const char* a = Env(kAuto); a != nullptr && std::string(a) == "0")
    return {fmt::format("BLAS: OpenBLAS kernel {} ({}=0: neither checked nor changed)", loaded, kAuto)};
  const std::string check = CheckLoadedKernel();
  const bool emulate = Env(kEmulate) != nullptr && std::string(Env(kEmulate)) != "0";
  if (coretype != nullptr && !emulate) {
    if (!check.empty())
      return {fmt::format("BLAS: {}={} is set, and kept; but its products fail here: {} (unset {} to let "
                          "the farm choose)", kCoreType, coretype, check, kCoreType), true};
    return {fmt::format("BLAS: OpenBLAS kernel {} ({}={} is set: kept as given)", loaded, kCoreType, coretype)};
  }
  BlasKernelPlan plan = PlanBlasKernel(ReadCpuFeatures(), loaded, check.empty());
  if (!check.empty()) plan.reason += fmt::format(" ({})", check);
  if (plan.candidates.empty()) {
    if (!check.empty())
      return {fmt::format("BLAS: OpenBLAS kernel {} fails its products: {}; {}", loaded, check, plan.reason),
              true};
    return {fmt::format("BLAS: OpenBLAS kernel {}: {}", loaded, plan.reason)};
  }
  double loaded_gflops = 0;
  if (check.empty()) WithOneBlasThread([&] { loaded_gflops = TimeSgemm(LoadedSgemm(), kTimedSize); });
  const BlasKernelChoice choice = ChooseBlasKernel(plan, loaded, loaded_gflops, ProbeKernelInChild);
  if (choice.kernel.empty()) return {choice.message, !check.empty()};
  // The choice travels in the environment: the new process finds it and does not probe again; so do the processes
  // it starts.
  ::setenv(kCoreType, choice.kernel.c_str(), 1);
  ::setenv(kChosen, choice.message.c_str(), 1);
  ::unsetenv(kEmulate);
  std::fflush(nullptr);
  if (argv != nullptr) execv("/proc/self/exe", argv);
  const int err = errno;
  ::unsetenv(kCoreType);
  ::unsetenv(kChosen);
  return {fmt::format("BLAS: OpenBLAS kernel {} kept: could not start again with {} (execv: {}); {}", loaded,
                      choice.kernel, std::strerror(err), choice.message),
          true};
}

}  // namespace

BlasKernelStart StartWithBestBlasKernel(char** argv) {
  RunBlasProbeIfAsked();
  BlasKernelStart start = Decide(argv);
  if (openblas_get_corename != nullptr) {
    decision = start.message;
    // The processes this one starts (farm-eval's learner and worker) inherit the decision and do not check again.
    std::string line = decision;
    std::replace(line.begin(), line.end(), '\n', ' ');
    ::setenv(kChosen, line.c_str(), 1);
  }
  return start;
}

std::string BlasKernelEnvironment() {
  if (decision.empty()) return "";
  std::string out;
  if (const char* coretype = Env(kCoreType); coretype != nullptr) out += fmt::format("{}={}\n", kCoreType, coretype);
  out += fmt::format("{}={}\n", kChosen, Env(kChosen));
  return out;
}

}  // namespace farm
