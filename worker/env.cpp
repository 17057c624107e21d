// The env registry and option resolution: how a config's env name and options
// become a family and the resolved options its spec and factory receive.
#include "worker/env.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

namespace farm {

void Env::state(float* /*out*/) const {
  throw std::logic_error("this env's spec declares a global_state, but the env does not override Env::state");
}

void Env::agents_done(uint8_t* /*out*/) const {
  throw std::logic_error(
      "this env's spec declares agents_finish_early, but the env does not override Env::agents_done");
}

EnvRegistry& EnvRegistry::Global() {
  // Function-local so registrations from any translation unit's static
  // initialisers find it constructed, whatever the initialisation order.
  static EnvRegistry registry;
  return registry;
}

bool EnvRegistry::Add(const std::string& name, EnvFamily family) {
  if (!family.spec || !family.make)
    throw std::logic_error(fmt::format("env {}: registered without spec or factory", name));
  // Two families under one name is a build bug (a copied registration); fail
  // at start-up rather than let link order pick one.
  if (!families_.emplace(name, std::move(family)).second)
    throw std::logic_error(fmt::format("env {}: registered twice", name));
  return true;
}

const EnvFamily* EnvRegistry::Find(const std::string& name) const {
  auto it = families_.find(name);
  return it == families_.end() ? nullptr : &it->second;
}

std::vector<std::string> EnvRegistry::Names() const {
  std::vector<std::string> names;
  names.reserve(families_.size());
  for (const auto& [name, family] : families_) names.push_back(name);
  return names;
}

Status ResolveEnvOptions(const std::string& env_name, const EnvOptions& defaults,
                         const std::map<std::string, double>& user, EnvOptions* out) {
  EnvOptions resolved = defaults;
  for (const auto& [key, value] : user) {
    auto it = resolved.find(key);
    if (it == resolved.end()) {
      std::vector<std::string> known;
      for (const auto& [k, v] : defaults) known.push_back(k);
      return Status::InvalidArgument(
          fmt::format("env {}: unknown option '{}'; known options: {}", env_name, key,
                      known.empty() ? std::string("(none)") : fmt::format("{}", fmt::join(known, ", "))));
    }
    it->second = value;
  }
  *out = std::move(resolved);
  return Status::Ok();
}

}  // namespace farm
