#include "common/config.h"
#include "common/update_paths.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "common/transport.h"  // CheckEndpoint

namespace farm {
namespace {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};


// A struct is a section when it has a visit() template; detect it by trying
// to visit with the loader below (see HasVisit).
template <class T, class V, class = void>
struct HasVisit : std::false_type {};
template <class T, class V>
struct HasVisit<T, V, std::void_t<decltype(std::declval<T&>().template visit<V>(std::declval<V&>()))>>
    : std::true_type {};

std::string NodeText(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  if (node.IsNull()) return "null";
  return "an undefined value";
}

std::string TypeName(const bool*) { return "true or false"; }
std::string TypeName(const int*) { return "an integer"; }
std::string TypeName(const int64_t*) { return "an integer"; }
std::string TypeName(const uint64_t*) { return "a non-negative integer"; }
std::string TypeName(const double*) { return "a number"; }
std::string TypeName(const std::string*) { return "a string"; }

// Adds `key` (at `path`) to the keys `seen` in one mapping: yaml-cpp accepts a key given twice, and the first one
// would win without a word.
void NoteKey(const std::string& key, const std::string& path, std::vector<std::string>* seen) {
  if (std::find(seen->begin(), seen->end(), key) != seen->end())
    throw ConfigError(fmt::format("{}: given twice; expected each key once", path));
  seen->push_back(key);
}

void CheckRule(double value, const Rule& rule, const std::string& key, const YAML::Node& node) {
  bool ok = std::isfinite(value);
  if (rule.min) ok = ok && (rule.min_exclusive ? value > *rule.min : value >= *rule.min);
  if (rule.max) ok = ok && value <= *rule.max;
  if (!ok) throw ConfigError(fmt::format("{}: expected {}, got {}", key, rule.Describe(), NodeText(node)));
}

// Parses YAML nodes into config structs; only keys present in the node are set.
class Loader {
 public:
  // given: where the dotted path of every key read is added (FarmConfig::given).
  Loader(const YAML::Node& node, std::string prefix, std::vector<std::string>* given)
      : node_(node), prefix_(std::move(prefix)), given_(given) {
    if (!node_.IsMap() && !node_.IsNull())
      throw ConfigError(fmt::format("{}: expected a mapping of keys, got {}", Where(), NodeText(node_)));
  }

  template <class T>
  void operator()(const char* key, T& field, const Rule& rule = {}) {
    known_.push_back(key);
    if (!node_.IsMap()) return;
    const YAML::Node child = node_[key];
    if (!child.IsDefined()) return;
    if (given_ != nullptr) given_->push_back(Path(key));
    Read(Path(key), child, field, rule);
  }

  // Rejects keys that no field claimed, and keys given twice (NoteKey).
  void Finish() const {
    if (!node_.IsMap()) return;
    std::vector<std::string> seen;
    for (const auto& kv : node_) {
      const auto key = kv.first.as<std::string>();
      if (std::find(known_.begin(), known_.end(), key) == known_.end())
        throw ConfigError(fmt::format("{}: unknown key; expected one of: {}", Path(key), fmt::join(known_, ", ")));
      NoteKey(key, Path(key), &seen);
    }
  }

 private:
  std::string Where() const { return prefix_.empty() ? "(top level)" : prefix_; }
  std::string Path(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }

  template <class T>
  static void ReadScalar(const std::string& key, const YAML::Node& node, T& field) {
    if (!node.IsScalar()) throw ConfigError(fmt::format("{}: expected {}, got {}", key, TypeName(&field), NodeText(node)));
    T value{};
    if (!YAML::convert<T>::decode(node, value))
      throw ConfigError(fmt::format("{}: expected {}, got {}", key, TypeName(&field), NodeText(node)));
    field = value;
  }

  void Read(const std::string& key, const YAML::Node& node, bool& field, const Rule&) {
    ReadScalar(key, node, field);
  }
  void Read(const std::string& key, const YAML::Node& node, std::string& field, const Rule& rule) {
    if (node.IsNull()) {
      field.clear();
    } else {
      ReadScalar(key, node, field);
    }
    if (!rule.one_of.empty() && std::find(rule.one_of.begin(), rule.one_of.end(), field) == rule.one_of.end())
      throw ConfigError(fmt::format("{}: expected {}, got {}", key, rule.Describe(), NodeText(node)));
  }
  template <class T, std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, int> = 0>
  void Read(const std::string& key, const YAML::Node& node, T& field, const Rule& rule) {
    if (node.IsScalar() && (node.Scalar() == "true" || node.Scalar() == "false"))
      throw ConfigError(fmt::format("{}: expected {}, got {}", key, TypeName(&field), NodeText(node)));
    ReadScalar(key, node, field);
    CheckRule(static_cast<double>(field), rule, key, node);
  }
  template <class T>
  void Read(const std::string& key, const YAML::Node& node, std::optional<T>& field, const Rule& rule) {
    if (node.IsNull()) {
      field.reset();
      return;
    }
    T value{};
    Read(key, node, value, rule);
    field = value;
  }
  template <class T>
  void Read(const std::string& key, const YAML::Node& node, std::vector<T>& field, const Rule& rule) {
    if (!node.IsSequence()) throw ConfigError(fmt::format("{}: expected a list, got {}", key, NodeText(node)));
    std::vector<T> values(node.size());
    for (std::size_t i = 0; i < node.size(); ++i) Read(fmt::format("{}[{}]", key, i), node[i], values[i], rule);
    field = std::move(values);
  }
  void Read(const std::string& key, const YAML::Node& node, std::map<std::string, double>& field,
            const Rule& rule) {
    if (node.IsNull()) {
      field.clear();
      return;
    }
    if (!node.IsMap()) throw ConfigError(fmt::format("{}: expected a mapping of name: number, got {}", key, NodeText(node)));
    std::vector<std::string> seen;
    for (const auto& kv : node) {
      double value = 0;
      const auto name = kv.first.as<std::string>();
      NoteKey(name, key + "." + name, &seen);
      Read(key + "." + name, kv.second, value, rule);
      field[name] = value;
    }
  }
  template <class T, std::enable_if_t<HasVisit<T, Loader>::value, int> = 0>
  void Read(const std::string& key, const YAML::Node& node, T& section, const Rule&) {
    Loader loader(node, key, given_);
    section.visit(loader);
    loader.Finish();
  }

  const YAML::Node& node_;
  std::string prefix_;
  std::vector<std::string> known_;
  std::vector<std::string>* given_;
};

// Writes config structs as YAML.
class Dumper {
 public:
  explicit Dumper(YAML::Emitter& out) : out_(out) {}

  template <class T>
  void operator()(const char* key, const T& field, const Rule& = {}) {
    out_ << YAML::Key << key << YAML::Value;
    Write(field);
  }

 private:
  template <class T, std::enable_if_t<!HasVisit<T, Dumper>::value, int> = 0>
  void Write(const T& value) {
    out_ << value;
  }
  void Write(double value) { out_ << YAML::Precision(17) << value; }
  void Write(const std::string& value) { out_ << YAML::DoubleQuoted << value; }
  template <class T>
  void Write(const std::optional<T>& value) {
    if (value) {
      Write(*value);
    } else {
      out_ << YAML::Null;
    }
  }
  template <class T>
  void Write(const std::vector<T>& values) {
    out_ << YAML::Flow << YAML::BeginSeq;
    for (const auto& v : values) Write(v);
    out_ << YAML::EndSeq;
  }
  void Write(const std::map<std::string, double>& values) {
    out_ << YAML::BeginMap;
    for (const auto& [k, v] : values) {
      out_ << YAML::Key << k << YAML::Value;
      Write(v);
    }
    out_ << YAML::EndMap;
  }
  template <class T, std::enable_if_t<HasVisit<T, Dumper>::value, int> = 0>
  void Write(const T& section) {
    out_ << YAML::BeginMap;
    const_cast<T&>(section).visit(*this);
    out_ << YAML::EndMap;
  }

  YAML::Emitter& out_;
};

void Apply(const YAML::Node& root, FarmConfig* out) {
  Loader loader(root, "", &out->given);
  out->visit(loader);
  loader.Finish();
}

// Turns "a.b.c=value" into the YAML tree {a: {b: {c: value}}}.
YAML::Node OverrideNode(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(fmt::format("expected KEY=VALUE (e.g. ppo.lr=1e-3), got '{}'", text));
  const std::string path = text.substr(0, eq);
  const std::string value = text.substr(eq + 1);
  YAML::Node leaf;
  try {
    leaf = value.empty() ? YAML::Node(YAML::NodeType::Null) : YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: cannot parse value '{}': {}", path, value, e.msg));
  }
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) {
    if (part.empty()) throw ConfigError(fmt::format("'{}': empty key in dotted path", path));
    parts.push_back(part);
  }
  YAML::Node node = leaf;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    YAML::Node parent(YAML::NodeType::Map);
    parent[*it] = node;
    node = parent;
  }
  return node;
}

// With a core (ppo.core gru or lstm), kCoreDefaults for the keys the config did not give.
void ApplyCoreDefaults(FarmConfig* out) {
  if (out->ppo.core == "none") return;
  const auto given = [&](const char* key) {
    return std::find(out->given.begin(), out->given.end(), key) != out->given.end();
  };
  if (!given("ppo.rollout_length")) out->ppo.rollout_length = kCoreDefaults.rollout_length;
  if (!given("ppo.lr")) out->ppo.lr = kCoreDefaults.lr;
}

// The checks of a `policies:` list (each policy's own config is checked by PolicyRunConfig).
Status ValidatePolicies(const FarmConfig& c) {
  if (c.policies.empty()) return Status::Ok();
  if (c.env.frame_stack != 1)
    return Status::InvalidArgument(fmt::format(
        "policies: several policies cannot stack frames (env.frame_stack is {}); set env.frame_stack=1",
        c.env.frame_stack));
  std::vector<std::string> names;
  for (std::size_t i = 0; i < c.policies.size(); ++i) {
    const auto& p = c.policies[i];
    const bool good = !p.name.empty() && std::all_of(p.name.begin(), p.name.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.';
    }) && p.name != "." && p.name != "..";
    if (!good)
      return Status::InvalidArgument(fmt::format(
          "policies[{}].name: expected letters, digits, '_', '-' or '.' (it names the policy's run directory), "
          "got '{}'",
          i, p.name));
    if (std::find(names.begin(), names.end(), p.name) != names.end())
      return Status::InvalidArgument(fmt::format("policies[{}].name: '{}' is given twice; expected each once", i,
                                                 p.name));
    names.push_back(p.name);
    if (p.agents.empty() || std::any_of(p.agents.begin(), p.agents.end(), [](const std::string& a) {
          return a.empty() || a.find(',') != std::string::npos;
        }))
      return Status::InvalidArgument(fmt::format(
          "policies[{}] ({}).agents: expected a list of agent names or patterns such as 'adversary_*' (none empty, "
          "no commas)",
          i, p.name));
  }
  if (c.learner.eval_episodes > 0)
    return Status::InvalidArgument(
        "learner.eval_episodes: a run with several policies is evaluated by farm-eval RUN (scripts/farm eval RUN), "
        "which serves every policy's checkpoint to the same envs and reports each policy's return; set it 0");
  FarmConfig probe = c;
  if (probe.run_dir.empty()) probe.run_dir = "runs/check";
  for (const auto& p : c.policies) {
    FarmConfig out;
    if (auto s = PolicyRunConfig(probe, p.name, &out); !s.ok()) return s;
  }
  return Status::Ok();
}

// The largest transport.worker_give_up_s: its milliseconds must fit in an int (ZMQ_SNDTIMEO).
constexpr double kMaxWorkerGiveUpS = 2147483;

}  // namespace

std::string Rule::Describe() const {
  if (!one_of.empty()) return fmt::format("one of: {}", fmt::join(one_of, ", "));
  if (min && max) return fmt::format("a value in [{}, {}]", *min, *max);
  if (min) return fmt::format("a value {} {}", min_exclusive ? ">" : ">=", *min);
  if (max) return fmt::format("a value <= {}", *max);
  return "a finite number";
}

Status ParseConfig(const std::string& yaml_text, const std::string& source, FarmConfig* out) {
  try {
    Apply(YAML::Load(yaml_text), out);
  } catch (const ConfigError& e) {
    return Status::InvalidArgument(fmt::format("{}: {}", source, e.what()));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(fmt::format("{}: line {}: {}", source, e.mark.line + 1, e.msg));
  }
  return Status::Ok();
}

void NoteConfigSource(const std::string& path, FarmConfig* config) {
  std::error_code ec;
  const std::filesystem::path file = std::filesystem::absolute(path, ec).lexically_normal();
  config->source_dir = file.parent_path().string();
  config->in_run_dir =
      file.filename() == "config.yaml" && std::filesystem::is_directory(file.parent_path() / "checkpoints", ec);
}

Status LoadConfig(const std::string& path, const std::vector<std::string>& overrides, FarmConfig* out) {
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) return Status::NotFound(fmt::format("{}: cannot open config file", path));
    std::stringstream text;
    text << in.rdbuf();
    if (auto s = ParseConfig(text.str(), path, out); !s.ok()) return s;
    // Parsed, so Load cannot throw here. An empty file is more likely a mistake (a truncated copy, the wrong
    // file) than a wish for every default, which would then train the default env without a word.
    if (const YAML::Node root = YAML::Load(text.str()); root.IsNull() || (root.IsMap() && root.size() == 0))
      return Status::InvalidArgument(fmt::format(
          "{}: no config keys (the file is empty, only comments or {{}}): expected a YAML mapping such as "
          "'env: {{name: CartPole-v1}}'; configs/ holds complete examples",
          path));
    NoteConfigSource(path, out);
  }
  for (const auto& text : overrides) {
    try {
      Apply(OverrideNode(text), out);
    } catch (const ConfigError& e) {
      return Status::InvalidArgument(fmt::format("--set {}: {}", text, e.what()));
    }
  }
  ApplyCoreDefaults(out);
  return ValidateConfig(*out);
}

Status PolicyRunConfig(const FarmConfig& run, const std::string& name, FarmConfig* out) {
  const auto it = std::find_if(run.policies.begin(), run.policies.end(),
                               [&](const PolicyConfig& p) { return p.name == name; });
  if (it == run.policies.end()) {
    std::vector<std::string> names;
    for (const auto& p : run.policies) names.push_back(p.name);
    return Status::NotFound(fmt::format("no policy '{}' in policies (the config's policies: {})", name,
                                        names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "))));
  }
  if (run.run_dir.empty())
    return Status::InvalidArgument(fmt::format(
        "policy '{}': run_dir is not set; the learners of a run with several policies share it (each writes "
        "run_dir/NAME; scripts/farm train sets it)",
        name));
  const auto index = static_cast<std::size_t>(it - run.policies.begin());
  FarmConfig c = run;
  c.policies.clear();
  for (const auto& text : it->set) {
    const std::string where = fmt::format("policies[{}] ({}).set '{}'", index, name, text);
    const auto key = text.substr(0, text.find('='));
    if (key.rfind("ppo.", 0) != 0 && key.rfind("learner.", 0) != 0 && key.rfind("batcher.", 0) != 0)
      return Status::InvalidArgument(fmt::format(
          "{}: a policy may set ppo.*, learner.* and batcher.* keys; the env, the transport and the run's own keys "
          "are every policy's",
          where));
    if (key == "learner.eval_episodes" || key == "learner.resume" || key == "learner.init_from" ||
        key == "learner.train")
      return Status::InvalidArgument(fmt::format(
          "{}: {} is the run's (evaluation and resuming take every policy together); a policy's own start is its "
          "init_from and trainable",
          where, key));
    try {
      Apply(OverrideNode(text), &c);
    } catch (const ConfigError& e) {
      return Status::InvalidArgument(fmt::format("{}: {}", where, e.what()));
    }
  }
  ApplyCoreDefaults(&c);
  c.run_dir = run.run_dir + "/" + name;
  c.name = run.name + "-" + name;
  if (!it->trainable) c.learner.train = false;
  if (!it->init_from.empty()) c.learner.init_from = it->init_from;
  // The workers normalise every policy's rows with the run's ppo.gamma and send statistics every
  // ppo.rollout_length requests.
  if ((c.env.normalize_obs || c.env.normalize_reward) &&
      (c.ppo.gamma != run.ppo.gamma || c.ppo.rollout_length != run.ppo.rollout_length))
    return Status::InvalidArgument(fmt::format(
        "policy '{}': with env.normalize_obs or env.normalize_reward, ppo.gamma and ppo.rollout_length are the run's "
        "(the workers normalise every policy's rows alike): the policy has {} and {}, the run {} and {}",
        name, c.ppo.gamma, c.ppo.rollout_length, run.ppo.gamma, run.ppo.rollout_length));
  if (auto s = ValidateConfig(c); !s.ok())
    return Status::InvalidArgument(fmt::format("policy '{}': {}", name, s.message()));
  *out = std::move(c);
  return Status::Ok();
}

namespace {

Status ValidateMujoco(const EnvConfig& env) {
  const MujocoConfig& m = env.mujoco;
  if (m.model.empty()) return Status::Ok();
  if (!env.python.empty())
    return Status::InvalidArgument(fmt::format(
        "env.mujoco.model ('{}') and env.python ('{}') each name the env: set one of them", m.model, env.python));
  if (!env.options.empty())
    return Status::InvalidArgument(
        "env.options: a robot described by env.mujoco takes no options; set its keys under env.mujoco");
  if (m.observation.empty())
    return Status::InvalidArgument("env.mujoco.observation: expected at least one part, got an empty list");
  if (!m.sensors.empty() && std::find(m.observation.begin(), m.observation.end(), "sensors") == m.observation.end())
    return Status::InvalidArgument(
        "env.mujoco.sensors names sensors, but env.mujoco.observation has no 'sensors' part to show them");
  if (m.forward == "body" && m.forward_body.empty() && m.forward_weight != 0)
    return Status::InvalidArgument(
        "env.mujoco.forward is 'body' but env.mujoco.forward_body is empty: name the body whose forward "
        "velocity is rewarded, set forward to root_x or mass_center, or forward_weight to 0");
  if (!(m.contact_force_min <= m.contact_force_max))
    return Status::InvalidArgument(
        fmt::format("env.mujoco.contact_force_min ({}) is above env.mujoco.contact_force_max ({})",
                    m.contact_force_min, m.contact_force_max));
  for (std::size_t i = 0; i < m.healthy.size(); ++i) {
    const MujocoHealthBound& b = m.healthy[i];
    const std::string key = fmt::format("env.mujoco.healthy[{}]", i);
    if (b.body.empty() == b.joint.empty())
      return Status::InvalidArgument(fmt::format(
          "{}: expected exactly one of body (a body's height) and joint (a joint's position), got {}", key,
          b.body.empty() ? "neither" : "both"));
    if (!b.min && !b.max) return Status::InvalidArgument(fmt::format("{}: expected min, max or both", key));
    if (b.min && b.max && !(*b.min <= *b.max))
      return Status::InvalidArgument(fmt::format("{}: min ({}) is above max ({})", key, *b.min, *b.max));
  }
  return Status::Ok();
}

}  // namespace

Status ValidateConfig(const FarmConfig& c) {
  if (auto s = ValidateMujoco(c.env); !s.ok()) return s;
  if (c.env.num_envs % c.env.num_groups != 0)
    return Status::InvalidArgument(fmt::format(
        "env.num_envs ({}) must be a multiple of env.num_groups ({})", c.env.num_envs, c.env.num_groups));
  if (c.stop_at_target && !c.target_return)
    return Status::InvalidArgument("stop_at_target is true but target_return is not set");
  if (c.learner.eval_episodes > 0 && c.env.decorrelate_episodes)
    return Status::InvalidArgument(fmt::format(
        "learner.eval_episodes ({}) counts whole episodes, but env.decorrelate_episodes cuts the first ones short and "
        "leaves them unreported: set env.decorrelate_episodes=false to evaluate",
        c.learner.eval_episodes));
  if (c.learner.eval_episodes > 0 && c.learner.train)
    return Status::InvalidArgument(fmt::format(
        "learner.eval_episodes ({}) evaluates a served policy: it needs learner.train=false (farm-learner --serve)",
        c.learner.eval_episodes));
  if (c.transport.heartbeat_timeout_s <= 2 * c.transport.heartbeat_interval_s)
    return Status::InvalidArgument(fmt::format(
        "transport.heartbeat_timeout_s ({}) must exceed twice transport.heartbeat_interval_s ({})",
        c.transport.heartbeat_timeout_s, c.transport.heartbeat_interval_s));
  // A worker passes it to ZeroMQ as a send timeout in milliseconds, an int: a larger value made it abort at start
  // ("terminate called after throwing an instance of 'zmq::error_t'").
  if (c.transport.worker_give_up_s > kMaxWorkerGiveUpS)
    return Status::InvalidArgument(fmt::format(
        "transport.worker_give_up_s: expected a value in (0, {}] (seconds, about 24.8 days), got {}", kMaxWorkerGiveUpS,
        c.transport.worker_give_up_s));
  if (c.learner.sync_fraction > 0 && c.mode != "sync")
    return Status::InvalidArgument(fmt::format(
        "learner.sync_fraction ({}) preempts stragglers in mode: sync only (got mode: {}; in async mode a rank "
        "acts on while its trainer waits); set learner.sync_fraction=0 or mode=sync",
        c.learner.sync_fraction, c.mode));
  const auto& d = c.learner.device;
  if (!(d == "auto" || d == "cpu" || d == "cuda" || (d.rfind("cuda:", 0) == 0 && d.size() > 5)))
    return Status::InvalidArgument(fmt::format("learner.device: expected auto, cpu, cuda or cuda:N, got '{}'", d));
  // ppo.fused_update=on and ppo.graph_update=on: the run's needs against the update paths' table
  // (common/update_paths.h), which the trainer reads too.
  {
    const UpdateNeeds needs = ConfigNeeds(c);
    for (const auto& [path, mode] : {std::pair<UpdatePath, const std::string*>{UpdatePath::kFused, &c.ppo.fused_update},
                                     {UpdatePath::kGraphed, &c.ppo.graph_update}}) {
      if (*mode != "on") continue;
      if (Status s = CheckUpdatePath(path, needs); !s.ok())
        return Status::InvalidArgument(fmt::format("{}; use {}=auto to fall back to the LibTorch update{}", s.message(),
                                                   UpdatePathKey(path), path == UpdatePath::kGraphed ? " (or off)" : ""));
    }
  }
  if (!c.ppo.actor_encoder_script.empty() && c.learner.cuda_graphs && !c.learner.random_actions)
    return Status::InvalidArgument(fmt::format(
        "learner.cuda_graphs does not capture a TorchScript encoder (ppo.actor_encoder_script is '{}'); set "
        "learner.cuda_graphs=false, or use a built-in encoder",
        c.ppo.actor_encoder_script));
  if (c.ppo.encoder == "conv" && c.ppo.conv.empty())
    return Status::InvalidArgument(
        "ppo.encoder=conv needs ppo.conv, its layers, e.g. [{channels: 32, kernel: 3, stride: 1, padding: 1}]");
  if (c.ppo.encoder == "impala" && c.ppo.impala_channels.empty())
    return Status::InvalidArgument("ppo.encoder=impala needs ppo.impala_channels, one entry per stage (e.g. [16, 32, "
                                   "32])");
  if (c.ppo.sde && c.learner.cuda_graphs && !c.learner.deterministic && !c.learner.random_actions)
    return Status::InvalidArgument(
        "learner.cuda_graphs cannot act with ppo.sde (each env's noise matrix is held between its steps, outside "
        "the graphs); set learner.cuda_graphs=false, or ppo.sde=false");
  if (c.ppo.core != "none") {
    if (c.ppo.bptt > c.ppo.rollout_length || c.ppo.rollout_length % c.ppo.chunk_steps() != 0)
      return Status::InvalidArgument(fmt::format(
          "ppo.bptt ({}) must divide ppo.rollout_length ({}): the update trains through whole chunks of bptt steps "
          "(0, the default: the whole rollout)",
          c.ppo.bptt, c.ppo.rollout_length));
    if (c.learner.sync_fraction > 0 && 2 * c.ppo.chunk_steps() > c.ppo.rollout_length)
      return Status::InvalidArgument(fmt::format(
          "learner.sync_fraction ({}) with ppo.core={} cuts rollouts at a chunk's start, so ppo.bptt must be at most "
          "half of ppo.rollout_length ({}); got bptt {} (0: the whole rollout)",
          c.learner.sync_fraction, c.ppo.core, c.ppo.rollout_length, c.ppo.bptt));
    if (c.learner.cuda_graphs && !c.learner.random_actions)
      return Status::InvalidArgument(fmt::format(
          "learner.cuda_graphs cannot act with ppo.core={} (the graphs were captured without a recurrent state); set "
          "learner.cuda_graphs=false, or ppo.core=none",
          c.ppo.core));
  }
  // ZeroMQ would take a port past 65535 modulo 65536 (tcp://127.0.0.1:99999 binds port 34463), and without a
  // port the address would be refused later as "not a loopback address".
  if (auto s = CheckEndpoint(c.transport.bind, /*bind=*/true); !s.ok())
    return Status::InvalidArgument("transport.bind: " + s.message());
  return ValidatePolicies(c);
}

std::string DumpConfig(const FarmConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  Dumper dumper(out);
  const_cast<FarmConfig&>(config).visit(dumper);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace farm
