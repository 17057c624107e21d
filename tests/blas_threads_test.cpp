// ShortenBlasThreadWait (learner/model/device.h): afterwards OpenBLAS's helper threads sleep within a millisecond
// of a job's end instead of spinning about 0.1 s, their pool comes back for threaded products, and products are
// unchanged. The process's CPU time while its only thread sleeps is mostly the helpers' spinning: 110 ms after
// each product with OpenBLAS's default wait on the development machine, under 1 ms with the short one.
#include <sys/resource.h>
#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>

#include "learner/model/device.h"

namespace {

double ProcessCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

}  // namespace

TEST_CASE("after ShortenBlasThreadWait OpenBLAS's idle threads sleep, and threaded products are unchanged") {
  const farm::BlasWait wait = farm::ShortenBlasThreadWait();
  INFO(wait.message);
  using Outcome = farm::BlasWait::Outcome;
  if (wait.outcome == Outcome::kNotOpenBlas || wait.outcome == Outcome::kUserSet) {
    WARN("skipped: " << wait.message);
    return;
  }
  REQUIRE(wait.outcome == Outcome::kShortened);
  farm::SetCpuThreads(2);
  torch::manual_seed(1);
  // Large enough for OpenBLAS to split the product between its threads.
  const torch::Tensor a = torch::randn({512, 512});
  const torch::Tensor b = torch::randn({512, 512});
  const torch::Tensor reference = a.to(torch::kFloat64).mm(b.to(torch::kFloat64)).to(torch::kFloat32);
  // ATen's own OpenMP threads spin a few milliseconds after each of its parallel operations (libgomp's spin
  // count): each measurement starts after they have gone to sleep, so what it sees is OpenBLAS's.
  const auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); };
  settle();
  for (int round = 0; round < 3; ++round) {
    const torch::Tensor c = a.mm(b);
    const double before = ProcessCpuSeconds();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const double idle = ProcessCpuSeconds() - before;
    INFO("round " << round << ": " << idle * 1e3 << " ms of CPU while the test's thread slept 200 ms");
    CHECK(idle < 0.03);
    REQUIRE(torch::allclose(c, reference, /*rtol=*/1e-4, /*atol=*/1e-3));
    settle();
  }
}
