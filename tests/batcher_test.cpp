// DynamicBatcher: max rows, the wait timeout, early release, back-pressure and close.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "learner/serve/batcher.h"

using namespace std::chrono_literals;
using farm::DynamicBatcher;

namespace {
struct Item {
  int id;
  int64_t rows;
};
DynamicBatcher<Item> Make(int64_t max_rows, std::chrono::microseconds wait, std::size_t capacity = 100) {
  return DynamicBatcher<Item>(max_rows, wait, capacity, [](const Item& i) { return i.rows; });
}
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TEST_CASE("a batch never exceeds max_rows and keeps arrival order", "[batcher]") {
  auto b = Make(10, 1s);
  for (int i = 0; i < 5; ++i) REQUIRE(b.Push({i, 4}).ok());  // 20 rows queued
  std::vector<Item> out;
  REQUIRE(b.NextBatch(&out).ok());  // full: released without waiting for the timeout
  REQUIRE(out.size() == 2);         // 4 + 4 fit, a third would make 12
  CHECK(out[0].id == 0);
  CHECK(out[1].id == 1);
  REQUIRE(b.NextBatch(&out).ok());
  REQUIRE(out.size() == 2);
  CHECK(out[0].id == 2);
  CHECK(b.size() == 1);
}

TEST_CASE("an item larger than max_rows still goes alone", "[batcher]") {
  auto b = Make(10, 1s);
  REQUIRE(b.Push({7, 25}).ok());
  std::vector<Item> out;
  REQUIRE(b.NextBatch(&out).ok());
  REQUIRE(out.size() == 1);
  CHECK(out[0].id == 7);
}

TEST_CASE("a partial batch is released after max_wait", "[batcher]") {
  auto b = Make(1000, 50ms);
  REQUIRE(b.Push({1, 3}).ok());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Item> out;
  REQUIRE(b.NextBatch(&out).ok());
  const double waited = Since(t0);
  CHECK(out.size() == 1);
  CHECK(waited >= 0.045);  // waited for more rows...
  CHECK(waited < 1.0);     // ...but not forever
}

TEST_CASE("items arriving during the wait join the batch", "[batcher]") {
  auto b = Make(8, 2s);
  REQUIRE(b.Push({1, 4}).ok());
  farm::Status pushed;  // Catch's assertions are not thread-safe: other threads hand their results back
  std::thread producer([&] {
    std::this_thread::sleep_for(20ms);
    pushed = b.Push({2, 4});
  });
  std::vector<Item> out;
  const auto t0 = std::chrono::steady_clock::now();
  const farm::Status taken = b.NextBatch(&out);
  producer.join();
  REQUIRE(pushed.ok());
  REQUIRE(taken.ok());
  CHECK(out.size() == 2);
  CHECK(Since(t0) < 1.0);  // released when full, long before the 2 s timeout
}

TEST_CASE("ready_items releases a batch as soon as that many items wait", "[batcher]") {
  auto b = Make(1000, 5s);
  b.SetReadyItems(2);
  REQUIRE(b.Push({1, 1}).ok());
  REQUIRE(b.Push({2, 1}).ok());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Item> out;
  REQUIRE(b.NextBatch(&out).ok());
  CHECK(out.size() == 2);
  CHECK(Since(t0) < 1.0);
}

TEST_CASE("PushFront items go first and are due at once", "[batcher]") {
  auto b = Make(1000, 5s);
  REQUIRE(b.Push({1, 1}).ok());
  REQUIRE(b.PushFront({0, 0}).ok());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Item> out;
  REQUIRE(b.NextBatch(&out).ok());
  CHECK(Since(t0) < 1.0);
  REQUIRE(out.size() == 2);
  CHECK(out[0].id == 0);
  CHECK(out[1].id == 1);
}

TEST_CASE("Push blocks at capacity until the consumer takes a batch", "[batcher]") {
  auto b = Make(1, 0us, /*capacity=*/2);
  REQUIRE(b.Push({1, 1}).ok());
  REQUIRE(b.Push({2, 1}).ok());
  std::atomic<bool> started{false}, pushed{false};
  farm::Status push_status;
  std::thread producer([&] {
    started = true;
    push_status = b.Push({3, 1});
    pushed = true;
  });
  // Once the producer is running, a Push that did not block would be done well within 50 ms.
  while (!started.load()) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(pushed.load());
  std::vector<Item> out;
  const farm::Status taken = b.NextBatch(&out);
  producer.join();
  REQUIRE(taken.ok());
  CHECK(push_status.ok());
  CHECK(pushed.load());
  CHECK(b.size() == 2);
}

TEST_CASE("Close wakes a waiting consumer and a blocked producer", "[batcher]") {
  auto b = Make(10, 10s, /*capacity=*/1);
  farm::Status consumer_status, producer_status;
  std::vector<Item> out;
  std::thread consumer([&] { consumer_status = b.NextBatch(&out); });
  std::this_thread::sleep_for(20ms);
  REQUIRE(b.Push({1, 1}).ok());  // consumer now waits up to 10 s for more rows
  std::thread producer([&] { producer_status = b.Push({2, 1}); });
  std::this_thread::sleep_for(20ms);
  const auto t0 = std::chrono::steady_clock::now();
  b.Close();
  consumer.join();
  producer.join();
  CHECK(Since(t0) < 1.0);
  CHECK(consumer_status.code() == farm::Status::Code::kClosed);
  CHECK(producer_status.code() == farm::Status::Code::kClosed);
  CHECK(b.Push({3, 1}).code() == farm::Status::Code::kClosed);
  CHECK(b.NextBatch(&out).code() == farm::Status::Code::kClosed);
}

TEST_CASE("many producers: every item is delivered exactly once", "[batcher]") {
  auto b = Make(16, 200us, 8);
  constexpr int kProducers = 4, kEach = 500;
  std::vector<std::thread> producers;
  std::atomic<int> failed_pushes{0};
  for (int p = 0; p < kProducers; ++p)
    producers.emplace_back([&, p] {
      for (int i = 0; i < kEach; ++i)
        if (!b.Push({p * kEach + i, 1 + (i % 3)}).ok()) failed_pushes.fetch_add(1);
    });
  std::vector<int> seen(kProducers * kEach, 0);
  int received = 0;
  std::vector<Item> out;
  while (received < kProducers * kEach) {
    REQUIRE(b.NextBatch(&out).ok());
    int64_t rows = 0;
    for (const auto& it : out) {
      ++seen[it.id];
      rows += it.rows;
    }
    CHECK((rows <= 16 || out.size() == 1));
    received += static_cast<int>(out.size());
  }
  for (auto& t : producers) t.join();
  CHECK(failed_pushes.load() == 0);
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
}

TEST_CASE("NextBatch with an idle timeout returns an empty batch when nothing comes", "[batcher]") {
  auto b = Make(10, 1s);
  std::vector<Item> out{{9, 9}};
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(b.NextBatch(&out, 30ms).ok());
  CHECK(out.empty());
  CHECK(Since(t0) >= 0.025);
  REQUIRE(b.Push({1, 1}).ok());
  b.SetReadyItems(1);
  REQUIRE(b.NextBatch(&out, 30ms).ok());
  CHECK(out.size() == 1);
}
