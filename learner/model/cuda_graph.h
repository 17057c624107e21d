// CUDA helpers of the learner, behind one small interface that also compiles against a CPU-only LibTorch
// (Debian's): CUDA-graph replay of the acting forward pass, a per-thread CUDA stream for the trainer, and
// a stream synchronisation. Without FARM_WITH_CUDA every CUDA request fails cleanly or does nothing.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "learner/model/amp.h"
#include "learner/model/policy.h"

namespace farm {

// Replays the acting forward pass (ActorCritic::Act: MLPs, head, sampling) from CUDA graphs
// (learner.cuda_graphs). A forward of a small MLP is bound by kernel launches, not arithmetic: one graph
// launch replaces ~20 kernel launches. Batches are padded up to a bucket (powers of two from 16); one
// graph per bucket is captured the first time a batch needs it. Padding rows hold stale observations and
// their outputs are ignored.
//
// The graphs read the policy's parameters in place: updating them with ActorCritic::CopyFrom (in-place
// copies, as the learner does) is seen by the next replay; replacing the tensors is not. Sampling draws
// from the default CUDA generator, which LibTorch registers with each capture, so every replay draws new
// numbers. Autocast (learner.precision) is recorded into the graph with the weight-cast cache disabled.
//
// With a centralised critic, `rows_per_state` rows (an env's agents) share one global state: batches come in
// whole envs, a bucket holds a power of two of envs (their agents' rows, and one state each), and the critic
// runs once per env, as in the eager forward, not once per row.
//
// Threading: an instance belongs to one thread (the learner's inference thread), which also owns the
// policy's forward passes. Replays run on that thread's current CUDA stream.
class GraphedActor {
 public:
  // Fails (InvalidArgument) when LibTorch was built without CUDA or `device` is not a CUDA device, or when
  // `state_shape` and the policy disagree on a global state. `policy` must already live on `device`.
  // `obs_shape`: one observation's shape; `state_shape`: one global state's shape when the policy's critic
  // takes one (policy->has_global_state()), else empty; `rows_per_state`: the rows that share one state (>= 1).
  static Status Create(ActorCritic policy, torch::Device device, Precision precision, std::vector<int64_t> obs_shape,
                       bool deterministic, std::unique_ptr<GraphedActor>* out,
                       std::vector<int64_t> state_shape = {}, int64_t rows_per_state = 1);
  ~GraphedActor();
  GraphedActor(const GraphedActor&) = delete;
  GraphedActor& operator=(const GraphedActor&) = delete;

  // obs: float32 [rows, obs_shape...], on the host (pinned memory makes the copy asynchronous) or on the
  // device; state: float32 [rows / rows_per_state, state_shape...] likewise, exactly when the policy has a
  // global state (rows then a multiple of rows_per_state). Returns device tensors of `rows` rows: views of the
  // graph's output buffers, valid until the next Act. The caller copies them out (which waits for the replay).
  ActOutput Act(const torch::Tensor& obs, const torch::Tensor& state = {});

  // The bucket a batch of `rows` units (rows, or envs with a state per env) is padded to.
  static int64_t BucketRows(int64_t rows);
  int captured_graphs() const;

 private:
  struct Impl;
  explicit GraphedActor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Makes a CUDA stream from LibTorch's pool the calling thread's current stream for `device` for the
// guard's lifetime, so that this thread's kernels (the PPO update) overlap other threads' (inference) on
// the GPU instead of queueing behind them on the default stream. A high-priority stream's pending kernels are
// scheduled before those of normal streams as the GPU's multiprocessors free up (the acting forward, whose
// latency the workers wait on, ahead of the update's). Does nothing for a CPU device or without CUDA.
// Synchronize() waits for the work queued on that stream. Create and destroy on one thread.
class ScopedCudaStream {
 public:
  explicit ScopedCudaStream(torch::Device device, bool high_priority = false);
  ~ScopedCudaStream();
  ScopedCudaStream(const ScopedCudaStream&) = delete;
  ScopedCudaStream& operator=(const ScopedCudaStream&) = delete;
  void Synchronize();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Waits for the work queued on the calling thread's current stream of `device` (no-op for a CPU device).
void SynchronizeCurrentStream(torch::Device device);

// The device's time for a span of work queued on the calling thread's current CUDA stream, from two CUDA
// events: Begin and End record them, and Seconds(), once the stream has passed End (after a synchronisation),
// is the time between them on the GPU, including any time the span's kernels waited there for the GPU (other
// streams' kernels, the trainer's). On a CPU device or without CUDA each call does nothing and Seconds() is 0.
// Threading: one thread, which also queues the span's work.
class DeviceSpan {
 public:
  explicit DeviceSpan(torch::Device device);
  ~DeviceSpan();
  DeviceSpan(const DeviceSpan&) = delete;
  DeviceSpan& operator=(const DeviceSpan&) = delete;
  void Begin();
  void End();
  double Seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// LibTorch's default CUDA generator is one per process, and a CUDA graph capture marks it as capturing: a draw
// from it on another thread meanwhile (sampling actions, a minibatch permutation) aborts the process ("Offset
// increment outside graph capture encountered unexpectedly"). So every capture, every replay and every eager
// draw from it on the learner's threads holds this lock, taken for a CUDA `device` only (a CPU device gets an
// empty lock). Draws take microseconds to queue; captures happen once per shape.
std::unique_lock<std::mutex> LockCudaGenerator(torch::Device device);

// Whether this build was compiled against a CUDA LibTorch (FARM_WITH_CUDA).
bool BuiltWithCuda();

}  // namespace farm
