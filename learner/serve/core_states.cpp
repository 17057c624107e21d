// The recurrent state of every served agent row, reset at episode starts.
#include "learner/serve/core_states.h"

#include <algorithm>
#include <cstring>

namespace farm {

void CoreStates::Gather(const std::string& identity, const wire::StepRequest& req, int64_t rows, float* dst,
                        float* final_dst) const {
  const std::size_t width = static_cast<std::size_t>(size_);
  const std::vector<float>* kept = nullptr;
  if (!req.first()) {
    const auto it = states_.find(identity);
    if (it != states_.end() && req.group() < it->second.size() &&
        it->second[req.group()].size() == static_cast<std::size_t>(rows) * width)
      kept = &it->second[req.group()];
  }
  if (kept == nullptr) {
    std::fill(dst, dst + rows * size_, 0.0f);
    if (final_dst) std::fill(final_dst, final_dst + static_cast<int64_t>(req.final_obs_index_size()) * size_, 0.0f);
    return;
  }
  std::memcpy(dst, kept->data(), kept->size() * sizeof(float));
  // A row whose previous step ended its episode starts the next one from zero. Flags shorter than the rows (a
  // malformed request is refused at admission) are read as far as they go.
  const std::string& terminated = req.terminated();
  const std::string& truncated = req.truncated();
  for (int64_t i = 0; i < rows; ++i) {
    const auto at = static_cast<std::size_t>(i);
    const bool ended = (at < terminated.size() && terminated[at] != 0) || (at < truncated.size() && truncated[at] != 0);
    if (ended) std::fill(dst + i * size_, dst + (i + 1) * size_, 0.0f);
  }
  if (final_dst) {
    for (int32_t row : req.final_obs_index()) {
      if (row >= 0 && row < rows) {
        std::memcpy(final_dst, kept->data() + static_cast<std::size_t>(row) * width, width * sizeof(float));
      } else {
        std::fill(final_dst, final_dst + size_, 0.0f);
      }
      final_dst += size_;
    }
  }
}

void CoreStates::Commit(const std::string& identity, uint32_t group, int64_t rows, const float* next) {
  std::vector<std::vector<float>>& groups = states_[identity];
  if (groups.size() <= group) groups.resize(group + 1);
  groups[group].assign(next, next + rows * size_);
}

int64_t CoreStates::rows() const {
  int64_t n = 0;
  for (const auto& [identity, groups] : states_)
    for (const auto& g : groups) n += static_cast<int64_t>(g.size()) / std::max<int64_t>(size_, 1);
  return n;
}

}  // namespace farm
