// DD-PPO's preemption of stragglers: full rollouts counted in the rendezvous store.
#include "learner/train/rollout_preemption.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cmath>
#include <exception>

namespace farm {

struct RolloutPreemption::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

RolloutPreemption::RolloutPreemption(std::unique_ptr<Impl> impl, int rank, int needed)
    : impl_(std::move(impl)), rank_(rank), needed_(needed) {}

RolloutPreemption::~RolloutPreemption() = default;

int RolloutPreemption::NeededRanks(double sync_fraction, int world_size) {
  // ceil, less a rounding margin for fractions such as 0.6 x 5 = 3.0000000000000004.
  return std::clamp(static_cast<int>(std::ceil(sync_fraction * world_size - 1e-9)), 1, std::max(world_size, 1));
}

Status RolloutPreemption::Create(const RankPlace& place, double sync_fraction, double timeout_s,
                                 std::unique_ptr<RolloutPreemption>* out) {
  if (!(sync_fraction > 0 && sync_fraction <= 1))
    return Status::InvalidArgument("learner.sync_fraction: expected a value in (0, 1], got " +
                                   std::to_string(sync_fraction));
  const int needed = NeededRanks(sync_fraction, place.world_size);
  auto impl = std::make_unique<Impl>();
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(place.master_port);
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    impl->store = c10::make_intrusive<c10d::TCPStore>(place.master_addr, options);
  } catch (const std::exception& e) {
    return Status::IoError("learner.sync_fraction: rank " + std::to_string(place.rank) +
                           " could not reach the rendezvous store at " + place.master_addr + ":" +
                           std::to_string(place.master_port) + ": " + e.what());
  }
  out->reset(new RolloutPreemption(std::move(impl), place.rank, needed));
  return Status::Ok();
}

Status RolloutPreemption::MarkFull(int64_t index) {
  try {
    impl_->store->add(Key(index), 1);
    if (rank_ == 0 && index > 0) impl_->store->deleteKey(Key(index - 1));
  } catch (const std::exception& e) {
    return Status::IoError("learner.sync_fraction: rank " + std::to_string(rank_) + " could not count its full rollout " +
                           std::to_string(index) + " in the rendezvous store (rank 0 gone?): " + e.what());
  }
  return Status::Ok();
}

Status RolloutPreemption::OthersReady(int64_t index, bool* ready) {
  *ready = index <= ready_index_;
  if (*ready) return Status::Ok();
  const auto now = std::chrono::steady_clock::now();
  if (now - last_poll_ < kPollInterval) return Status::Ok();
  last_poll_ = now;
  try {
    if (impl_->store->add(Key(index), 0) >= needed_) {
      ready_index_ = index;
      *ready = true;
    }
  } catch (const std::exception& e) {
    return Status::IoError("learner.sync_fraction: rank " + std::to_string(rank_) +
                           " could not read the ranks' full rollouts from the rendezvous store (rank 0 gone?): " +
                           e.what());
  }
  return Status::Ok();
}

}  // namespace farm
