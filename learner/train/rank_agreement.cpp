#include "learner/train/rank_agreement.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace farm {
namespace {

constexpr int kStopBits = 5;
// Columns: the figures, then one column per stop bit (0 or 1; the sum over ranks says whether any rank set it).
enum Column : int64_t {
  kEnvSteps,
  kHandoff,
  kWorkers,
  kSps,
  kUpdates,
  kUpdate,
  kAllreduceS,
  kAllreduceBytes,
  kChecksum,
  kRollouts,
  kCutRollouts,
  kCutSteps,
  kFirstBit,
  kColumns = kFirstBit + kStopBits
};

}  // namespace

std::string RankStopText(int bits) {
  static const char* const kNames[kStopBits] = {"a stop request", "target_return", "max_wall_seconds",
                                                "learner.eval_episodes", "a failure"};
  std::string out;
  for (int b = 0; b < kStopBits; ++b) {
    if ((bits & (1 << b)) == 0) continue;
    if (!out.empty()) out += ", ";
    out += kNames[b];
  }
  return out.empty() ? "nothing" : out;
}

RankAgreement Agree(RankGroup& group, const RankFigures& mine) {
  // Each rank fills its own row of a [world, columns] table of zeros; the sum is every rank's table.
  torch::Tensor table = torch::zeros({group.size(), kColumns}, torch::kFloat64);
  double* row = table.data_ptr<double>() + group.rank() * kColumns;
  row[kEnvSteps] = mine.env_steps;
  row[kHandoff] = mine.handoff_env_steps;
  row[kWorkers] = mine.workers;
  row[kSps] = mine.env_steps_per_s;
  row[kUpdates] = mine.updates;
  row[kUpdate] = mine.update_seconds;
  row[kAllreduceS] = mine.allreduce_seconds;
  row[kAllreduceBytes] = mine.allreduce_bytes;
  row[kChecksum] = mine.checksum;
  row[kRollouts] = mine.rollouts;
  row[kCutRollouts] = mine.cut_rollouts;
  row[kCutSteps] = mine.cut_steps;
  for (int b = 0; b < kStopBits; ++b) row[kFirstBit + b] = (mine.stop & (1 << b)) ? 1.0 : 0.0;
  group.AllReduceSum(table);
  RankAgreement a;
  const double* t = table.data_ptr<double>();
  for (int r = 0; r < group.size(); ++r) {
    const double* x = t + r * kColumns;
    RankFigures f;
    f.env_steps = x[kEnvSteps];
    f.handoff_env_steps = x[kHandoff];
    f.workers = x[kWorkers];
    f.env_steps_per_s = x[kSps];
    f.updates = x[kUpdates];
    f.update_seconds = x[kUpdate];
    f.allreduce_seconds = x[kAllreduceS];
    f.allreduce_bytes = x[kAllreduceBytes];
    f.checksum = x[kChecksum];
    f.rollouts = x[kRollouts];
    f.cut_rollouts = x[kCutRollouts];
    f.cut_steps = x[kCutSteps];
    for (int b = 0; b < kStopBits; ++b)
      if (x[kFirstBit + b] > 0) f.stop |= 1 << b;
    a.env_steps += f.env_steps;
    a.handoff_env_steps += f.handoff_env_steps;
    a.stop |= f.stop;
    if (f.stop != kRankStopNone && a.first_stopping_rank < 0) a.first_stopping_rank = r;
    a.ranks.push_back(f);
  }
  return a;
}

RunningMoments MergeAcrossRanks(RankGroup& group, const RunningMoments& mine, int64_t dim) {
  const int64_t columns = 1 + 2 * dim;
  torch::Tensor table = torch::zeros({group.size(), columns}, torch::kFloat64);
  if (!mine.empty()) {
    if (mine.dim() != dim)
      throw std::invalid_argument("MergeAcrossRanks: moments of " + std::to_string(mine.dim()) + " elements, expected " +
                                  std::to_string(dim));
    double* row = table.data_ptr<double>() + group.rank() * columns;
    row[0] = static_cast<double>(mine.count());
    for (int64_t i = 0; i < dim; ++i) {
      row[1 + i] = mine.mean()[i];
      row[1 + dim + i] = mine.m2()[i];
    }
  }
  group.AllReduceSum(table);
  RunningMoments out(dim);
  const double* t = table.data_ptr<double>();
  for (int r = 0; r < group.size(); ++r) {
    const double* row = t + r * columns;
    const auto count = static_cast<int64_t>(row[0]);
    if (count == 0) continue;
    RunningMoments part;
    const Status s = RunningMoments::Make(count, std::vector<double>(row + 1, row + 1 + dim),
                                          std::vector<double>(row + 1 + dim, row + 1 + 2 * dim), &part);
    if (!s.ok()) throw std::runtime_error("MergeAcrossRanks: " + s.message());
    out.Merge(part);
  }
  return out;
}

}  // namespace farm
