// Compiling MJCF into an mjModel: from a file, or from text in memory through MuJoCo's virtual file system.
#include "worker/envs/mujoco/model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "worker/envs/mujoco/builtin_models.h"

namespace farm::mujoco {
namespace {

// MuJoCo's default error handler prints and calls exit(): a worker would vanish without a word to its
// learner. Errors become exceptions instead, which the worker reports as any env failure. Installed once,
// before the first model compiles.
void ThrowMujocoError(const char* message) { throw std::runtime_error(fmt::format("MuJoCo: {}", message)); }

void InstallErrorHandler() {
  static std::once_flag once;
  std::call_once(once, [] { mju_user_error = ThrowMujocoError; });
}

// Frees an mjVFS (and its files) on every path out of FromText.
struct VfsDeleter {
  void operator()(mjVFS* vfs) const {
    mj_deleteVFS(vfs);
    delete vfs;
  }
};

}  // namespace

Model::~Model() { mj_deleteModel(model_); }

Status Model::FromFile(const std::string& path, std::shared_ptr<const Model>* out) {
  InstallErrorHandler();
  char error[1000] = "";
  mjModel* m = mj_loadXML(path.c_str(), nullptr, error, sizeof(error));
  if (m == nullptr) return Status::InvalidArgument(fmt::format("MuJoCo model {}: {}", path, error));
  out->reset(new Model(path, m));
  return Status::Ok();
}

Status Model::FromText(const std::string& name, const std::string& xml, std::shared_ptr<const Model>* out) {
  InstallErrorHandler();
  std::unique_ptr<mjVFS, VfsDeleter> vfs(new mjVFS);
  mj_defaultVFS(vfs.get());
  if (mj_makeEmptyFileVFS(vfs.get(), name.c_str(), static_cast<int>(xml.size())) != 0)
    return Status::Internal(fmt::format("MuJoCo model {}: no room in the virtual file system", name));
  const int index = mj_findFileVFS(vfs.get(), name.c_str());
  std::copy(xml.begin(), xml.end(), static_cast<char*>(vfs->filedata[index]));
  char error[1000] = "";
  mjModel* m = mj_loadXML(name.c_str(), vfs.get(), error, sizeof(error));
  if (m == nullptr) return Status::InvalidArgument(fmt::format("MuJoCo model {}: {}", name, error));
  out->reset(new Model(name, m));
  return Status::Ok();
}

int Model::BodyId(const std::string& body) const { return mj_name2id(model_, mjOBJ_BODY, body.c_str()); }

std::vector<std::string> Model::Names(mjtObj type, int count) const {
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) {
    const char* n = mj_id2name(model_, type, i);
    names.emplace_back(n != nullptr ? n : fmt::format("#{}", i));
  }
  return names;
}

const std::string& BuiltinModelText(const std::string& file) {
  const auto& files = BuiltinModelFiles();
  auto it = files.find(file);
  if (it == files.end())
    throw std::invalid_argument(
        fmt::format("no built-in MuJoCo model '{}'; built in: {}", file, fmt::join(BuiltinModelNames(), ", ")));
  return it->second;
}

std::vector<std::string> BuiltinModelNames() {
  std::vector<std::string> names;
  for (const auto& [name, text] : BuiltinModelFiles()) names.push_back(name);
  return names;
}

std::shared_ptr<const Model> BuiltinModel(const std::string& file) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Model>> cache;  // GUARDED_BY(mu)
  const std::string& text = BuiltinModelText(file);
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[file];
  if (!slot) {
    const Status s = Model::FromText(file, text, &slot);
    if (!s.ok()) throw std::runtime_error(fmt::format("the built-in {}", s.message()));
  }
  return slot;
}

}  // namespace farm::mujoco
