// The OpenBLAS kernel choice (learner/model/blas_kernel.h): the plan on recorded CPUs and kernels, the choice
// against stand-in probes, the products' check against stand-in kernels, real probes in child processes, and
// this program started as farm-learner starts (once more at most, never in a loop).
//
// This file has its own main: run with --start-blas-kernel it does what farm-learner's main does first and prints
// what it decided; in a probe child it runs the probe.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "learner/model/blas_kernel.h"

namespace {

using farm::CpuFeatures;
using farm::KernelProbe;
using farm::SimdLevel;

CpuFeatures Cpu(const std::string& vendor, int family, int model, SimdLevel level, bool os_zmm = true) {
  CpuFeatures c;
  c.vendor = vendor;
  c.family = family;
  c.model = model;
  c.os_ymm = true;
  if (level >= SimdLevel::kAvx) c.avx = true;
  if (level >= SimdLevel::kAvx2) c.avx2 = c.fma = true;
  if (level >= SimdLevel::kAvx512) {
    c.avx512f = c.avx512cd = c.avx512bw = c.avx512dq = c.avx512vl = true;
    c.os_zmm = os_zmm;
  }
  return c;
}

// Recorded as cpuid reports them (display family and model).
const CpuFeatures kEmeraldRapids = Cpu("GenuineIntel", 6, 207, SimdLevel::kAvx512);
const CpuFeatures kZen4 = Cpu("AuthenticAMD", 25, 17, SimdLevel::kAvx512);
const CpuFeatures kZen2 = Cpu("AuthenticAMD", 23, 49, SimdLevel::kAvx2);
const CpuFeatures kHaswell = Cpu("GenuineIntel", 6, 63, SimdLevel::kAvx2);

// A plain float sgemm (column-major), right within the check's bound; the stand-ins below break it one way each.
enum class Fault { kNone, kIgnoreTranspose, kIgnoreBeta, kOneElement, kOneUlp };
Fault fault = Fault::kNone;
void StandInSgemm(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
                  const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
                  const int* ldc) {
  const bool at = *ta != 'N' && fault != Fault::kIgnoreTranspose, bt = *tb != 'N' && fault != Fault::kIgnoreTranspose;
  for (int j = 0; j < *n; ++j) {
    for (int i = 0; i < *m; ++i) {
      float dot = 0;
      for (int p = 0; p < *k; ++p) {
        const float x = at ? a[p + i * *lda] : a[i + p * *lda];
        const float y = bt ? b[j + p * *ldb] : b[p + j * *ldb];
        dot += x * y;
      }
      float& out = c[i + j * *ldc];
      out = *alpha * dot + (fault == Fault::kIgnoreBeta ? 0.0f : *beta * out);
    }
  }
  if (fault == Fault::kOneElement && *m * *n > 5) c[5] += 1e-2f;
  if (fault == Fault::kOneUlp) c[0] = std::nextafter(c[0], 1e30f);
}

std::string CheckWith(Fault f) {
  fault = f;
  return farm::CheckSgemm(StandInSgemm);
}

KernelProbe Probe(const std::string& kernel, KernelProbe::Result result, double gflops = 0) {
  KernelProbe p;
  p.kernel = kernel;
  p.result = result;
  p.gflops = gflops;
  return p;
}

// This program started as farm-learner starts, with these variables set (the others as the tests run).
struct Started {
  int mains = 0;  // how many times main began: 2 when it started itself again
  std::string decision, kernel, environment;
};
Started StartThisProgram(const std::string& variables) {
  const std::string cmd = "env -u OPENBLAS_CORETYPE -u FARM_BLAS_CHOSEN -u FARM_BLAS_EMULATE_FALLBACK -u "
                          "FARM_BLAS_AUTO " + variables + " timeout 120 /proc/" + std::to_string(getpid()) +
                          "/exe --start-blas-kernel";
  Started s;
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  char line[4096];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    std::string l(line);
    if (!l.empty() && l.back() == '\n') l.pop_back();
    if (l == "main") ++s.mains;
    if (l.rfind("decision ", 0) == 0) s.decision = l.substr(9);
    if (l.rfind("kernel ", 0) == 0) s.kernel = l.substr(7);
    if (l.rfind("env ", 0) == 0) s.environment += l.substr(4) + "\n";
  }
  REQUIRE(pclose(f) == 0);
  return s;
}

bool LoadedIsOpenBlas() { return !farm::LoadedBlasInfo().kernel.empty(); }

}  // namespace

TEST_CASE("the plan: an unknown Intel model with AVX-512 on OpenBLAS's fallback tries SkylakeX, then Haswell",
          "[blas]") {
  REQUIRE(farm::CpuLevel(kEmeraldRapids) == SimdLevel::kAvx512);
  const auto plan = farm::PlanBlasKernel(kEmeraldRapids, "Prescott", true);
  REQUIRE(plan.candidates == std::vector<std::string>{"SkylakeX", "Haswell", "Sandybridge"});
  CHECK(plan.reason.find("Prescott") != std::string::npos);
  CHECK(plan.reason.find("family 6 model 207") != std::string::npos);
  // Already on the widest: kept.
  CHECK(farm::PlanBlasKernel(kEmeraldRapids, "SkylakeX", true).candidates.empty());
  CHECK(farm::PlanBlasKernel(kEmeraldRapids, "COOPERLAKE", true).candidates.empty());
  // The OS does not save the ZMM registers: AVX-512 cannot run, AVX2 is the ceiling.
  const CpuFeatures no_zmm = Cpu("GenuineIntel", 6, 207, SimdLevel::kAvx512, /*os_zmm=*/false);
  CHECK(farm::CpuLevel(no_zmm) == SimdLevel::kAvx2);
  CHECK(farm::PlanBlasKernel(no_zmm, "Haswell", true).candidates.empty());
  CHECK(farm::PlanBlasKernel(no_zmm, "Prescott", true).candidates == std::vector<std::string>{"Haswell", "Sandybridge"});
}

TEST_CASE("the plan: AMD with AVX-512 tries SkylakeX over Zen, AMD with AVX2 keeps Zen", "[blas]") {
  CHECK(farm::PlanBlasKernel(kZen4, "Zen", true).candidates == std::vector<std::string>{"SkylakeX"});
  CHECK(farm::PlanBlasKernel(kZen2, "Zen", true).candidates.empty());
  CHECK(farm::PlanBlasKernel(kZen2, "Haswell", true).candidates.empty());
  CHECK(farm::PlanBlasKernel(kZen2, "Prescott", true).candidates ==
        std::vector<std::string>{"Zen", "Haswell", "Sandybridge"});
  CHECK(farm::PlanBlasKernel(kHaswell, "Haswell", true).candidates.empty());
  CHECK(farm::PlanBlasKernel(kHaswell, "Nehalem", true).candidates == std::vector<std::string>{"Haswell", "Sandybridge"});
}

TEST_CASE("the plan: a kernel that fails the check is replaced by narrower ones, an unknown one is kept", "[blas]") {
  CHECK(farm::PlanBlasKernel(kEmeraldRapids, "SkylakeX", false).candidates ==
        std::vector<std::string>{"Haswell", "Sandybridge", "Prescott"});
  // A kernel wider than the CPU (a wrong OPENBLAS_CORETYPE that did not crash): down from what the CPU runs.
  CHECK(farm::PlanBlasKernel(kZen2, "SkylakeX", false).candidates ==
        std::vector<std::string>{"Zen", "Haswell", "Sandybridge", "Prescott"});
  const auto unknown = farm::PlanBlasKernel(kEmeraldRapids, "Unknown", true);
  CHECK(unknown.candidates.empty());
  CHECK(unknown.reason.find("not one this check knows") != std::string::npos);
  CHECK(farm::KernelLevel("sKyLaKeX") == SimdLevel::kAvx512);
  CHECK(!farm::KernelLevel("NoSuchKernel").has_value());
}

TEST_CASE("the choice takes the first candidate that runs right and is not slower, and says what it tried",
          "[blas]") {
  const auto plan = farm::PlanBlasKernel(kEmeraldRapids, "Prescott", true);
  std::vector<std::string> asked;
  SECTION("a crashing kernel falls back to the next") {
    const auto choice = farm::ChooseBlasKernel(plan, "Prescott", 10.0, [&](const std::string& k) {
      asked.push_back(k);
      auto p = Probe(k, k == "SkylakeX" ? KernelProbe::Result::kCrashed : KernelProbe::Result::kOk, 25.0);
      if (k == "SkylakeX") p.detail = "killed by SIGILL";
      return p;
    });
    CHECK(choice.kernel == "Haswell");
    CHECK(asked == std::vector<std::string>{"SkylakeX", "Haswell"});
    CHECK(choice.message.find("instead of Prescott") != std::string::npos);
    CHECK(choice.message.find("SkylakeX failed (killed by SIGILL)") != std::string::npos);
  }
  SECTION("a wrong product and a kernel the build lacks are skipped") {
    const auto choice = farm::ChooseBlasKernel(plan, "Prescott", 10.0, [&](const std::string& k) {
      asked.push_back(k);
      return Probe(k, k == "SkylakeX"  ? KernelProbe::Result::kWrongProduct
                      : k == "Haswell" ? KernelProbe::Result::kNotInBuild
                                       : KernelProbe::Result::kOk, 12.0);
    });
    CHECK(choice.kernel == "Sandybridge");
    REQUIRE(choice.tried.size() == 3);
    CHECK(choice.tried[0].result == KernelProbe::Result::kWrongProduct);
    CHECK(choice.tried[1].result == KernelProbe::Result::kNotInBuild);
  }
  SECTION("a slower kernel is not taken; none passing keeps the loaded one") {
    const auto choice = farm::ChooseBlasKernel(plan, "Prescott", 10.0, [&](const std::string& k) {
      return Probe(k, k == "Sandybridge" ? KernelProbe::Result::kOk : KernelProbe::Result::kCrashed,
                   farm::kMinSpeedRatio * 10.0 - 0.5);
    });
    CHECK(choice.kernel.empty());
    REQUIRE(choice.tried.size() == 3);
    CHECK(choice.tried[2].result == KernelProbe::Result::kSlower);
    CHECK(choice.message.find("Prescott (10.0 GFLOP/s) kept") != std::string::npos);
  }
  SECTION("no candidates: nothing is probed") {
    const auto keep = farm::PlanBlasKernel(kZen2, "Zen", true);
    const auto choice = farm::ChooseBlasKernel(keep, "Zen", 10.0, [&](const std::string& k) {
      asked.push_back(k);
      return Probe(k, KernelProbe::Result::kOk, 100.0);
    });
    CHECK(choice.kernel.empty());
    CHECK(asked.empty());
  }
}

TEST_CASE("the products' check passes a right sgemm and catches each wrong one", "[blas]") {
  CHECK(CheckWith(Fault::kNone).empty());
  CHECK(CheckWith(Fault::kOneUlp).empty());  // within float rounding
  const std::string transposed = CheckWith(Fault::kIgnoreTranspose);
  CHECK(transposed.find("sgemm T") != std::string::npos);
  CHECK(CheckWith(Fault::kIgnoreBeta).find("beta 1") != std::string::npos);
  const std::string one = CheckWith(Fault::kOneElement);
  CHECK(one.find("element (5, 0)") != std::string::npos);
  CHECK(one.find("expected") != std::string::npos);
  // The process's own BLAS.
  if (farm::LoadedSgemm() == nullptr) {
    WARN("no sgemm_ loaded");
    return;
  }
  CHECK(farm::CheckSgemm(farm::LoadedSgemm()).empty());
  CHECK(farm::TimeSgemm(farm::LoadedSgemm(), 128) > 0.1);
}

TEST_CASE("a probe in a child process: a kernel the CPU lacks crashes there, one the build lacks is named",
          "[blas]") {
  if (!LoadedIsOpenBlas()) {
    WARN("skipped: the BLAS is not OpenBLAS");
    return;
  }
  const SimdLevel cpu = farm::CpuLevel(farm::ReadCpuFeatures());
  const KernelProbe skx = farm::ProbeKernelInChild("SkylakeX");
  INFO(skx.detail);
  if (cpu == SimdLevel::kAvx512) {
    CHECK(skx.result == KernelProbe::Result::kOk);
    CHECK(skx.gflops > 0);
  } else {
    // AVX-512 instructions on a CPU without them: SIGILL in the child, nothing here.
    CHECK(skx.result == KernelProbe::Result::kCrashed);
    CHECK(skx.detail.find("SIGILL") != std::string::npos);
  }
  const KernelProbe none = farm::ProbeKernelInChild("NoSuchKernel");
  CHECK(none.result == KernelProbe::Result::kNotInBuild);
  const KernelProbe prescott = farm::ProbeKernelInChild("Prescott");
  CHECK(prescott.result == KernelProbe::Result::kOk);
  CHECK(prescott.gflops > 0);
}

TEST_CASE("started as farm-learner starts: OpenBLAS's fallback is replaced once, a user's setting is kept, and a "
          "choice made before is never made again", "[blas]") {
  if (!LoadedIsOpenBlas()) {
    WARN("skipped: the BLAS is not OpenBLAS");
    return;
  }
  const SimdLevel cpu = farm::CpuLevel(farm::ReadCpuFeatures());
  SECTION("OpenBLAS's fallback, reproduced: Prescott replaced by the widest kernel the CPU runs, in one restart") {
    if (cpu == SimdLevel::kBaseline) {
      WARN("skipped: this CPU runs nothing wider than Prescott");
      return;
    }
    const Started s = StartThisProgram("OPENBLAS_CORETYPE=Prescott FARM_BLAS_EMULATE_FALLBACK=1");
    INFO(s.decision);
    CHECK(s.mains == 2);
    REQUIRE(farm::KernelLevel(s.kernel).has_value());
    CHECK(*farm::KernelLevel(s.kernel) == cpu);
    CHECK(s.decision.find("instead of Prescott") != std::string::npos);
    CHECK(s.environment.find("OPENBLAS_CORETYPE=" + s.kernel + "\n") != std::string::npos);
    CHECK(s.environment.find("FARM_BLAS_CHOSEN=" + s.decision + "\n") != std::string::npos);
  }
  SECTION("a kernel that crashes here (SkylakeX without AVX-512), reproduced as OpenBLAS's choice, is replaced") {
    const Started s = StartThisProgram("OPENBLAS_CORETYPE=SkylakeX FARM_BLAS_EMULATE_FALLBACK=1");
    INFO(s.decision);
    if (cpu == SimdLevel::kAvx512) {
      CHECK(s.mains == 1);
      CHECK(s.kernel == "SkylakeX");
    } else {
      CHECK(s.mains == 2);
      CHECK(s.decision.find("SIGILL") != std::string::npos);
      REQUIRE(farm::KernelLevel(s.kernel).has_value());
      CHECK(*farm::KernelLevel(s.kernel) == cpu);
    }
  }
  SECTION("a user's OPENBLAS_CORETYPE is kept as given") {
    const Started s = StartThisProgram("OPENBLAS_CORETYPE=Prescott");
    INFO(s.decision);
    CHECK(s.mains == 1);
    CHECK(s.kernel == "Prescott");
    CHECK(s.decision.find("is set: kept as given") != std::string::npos);
  }
  SECTION("a choice made before (FARM_BLAS_CHOSEN) is not made again, even when it did not take") {
    Started s = StartThisProgram("OPENBLAS_CORETYPE=Prescott FARM_BLAS_CHOSEN=chosen-by-the-launcher");
    CHECK(s.mains == 1);
    CHECK(s.kernel == "Prescott");
    CHECK(s.decision == "chosen-by-the-launcher");
    s = StartThisProgram("OPENBLAS_CORETYPE=NoSuchKernel FARM_BLAS_CHOSEN=chosen-by-the-launcher");
    CHECK(s.mains == 1);
    CHECK(s.decision.find("not the NoSuchKernel chosen before") != std::string::npos);
  }
  SECTION("FARM_BLAS_AUTO=0 leaves OpenBLAS as it loaded") {
    const Started s =
        StartThisProgram("OPENBLAS_CORETYPE=Prescott FARM_BLAS_EMULATE_FALLBACK=1 FARM_BLAS_AUTO=0");
    CHECK(s.mains == 1);
    CHECK(s.kernel == "Prescott");
  }
  SECTION("as OpenBLAS loads here: at most one restart, and a kernel as wide as the CPU runs unless each wider one "
          "was tried and refused") {
    const Started s = StartThisProgram("");
    INFO(s.decision);
    CHECK(s.mains <= 2);
    REQUIRE(farm::KernelLevel(s.kernel).has_value());
    if (*farm::KernelLevel(s.kernel) < cpu) {
      CHECK(s.mains == 1);
      CHECK(s.decision.find("no other kernel passed: tried") != std::string::npos);
    }
  }
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--start-blas-kernel") {
    std::printf("main\n");
    std::fflush(stdout);
    const farm::BlasKernelStart start = farm::StartWithBestBlasKernel(argv);
    std::printf("decision %s\nkernel %s\n", start.message.c_str(), farm::LoadedBlasInfo().kernel.c_str());
    std::string env = farm::BlasKernelEnvironment();
    for (size_t pos = 0; pos < env.size();) {
      const size_t end = env.find('\n', pos);
      std::printf("env %s\n", env.substr(pos, end - pos).c_str());
      pos = end + 1;
    }
    return 0;
  }
  farm::RunBlasProbeIfAsked();
  return Catch::Session().run(argc, argv);
}
