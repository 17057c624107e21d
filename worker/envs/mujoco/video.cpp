#include "worker/envs/mujoco/video.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#if FARM_HAVE_RENDER
#include <GL/osmesa.h>
#include <fcntl.h>
#include <gif_lib.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;
#endif

namespace farm::mujoco {

#if !FARM_HAVE_RENDER

Status WriteVideo(const EpisodeRecording&, const std::string& path, const VideoOptions&) {
  return Status::NotFound(fmt::format(
      "cannot render {}: this build has no renderer: Mesa's OSMesa and giflib were not found when it was "
      "configured (Debian: apt-get install libosmesa6-dev libgif-dev, then rebuild; scripts/farm installs them)",
      path));
}

#else

namespace {

// A software OpenGL context current on this thread, drawing into a buffer of its own, for as long as it lives.
class OffscreenContext {
 public:
  OffscreenContext(int width, int height) : pixels_(static_cast<std::size_t>(width) * height * 4) {
    context_ = OSMesaCreateContextExt(OSMESA_RGBA, 24, 8, 0, nullptr);
    if (context_ != nullptr && !OSMesaMakeCurrent(context_, pixels_.data(), GL_UNSIGNED_BYTE, width, height)) {
      OSMesaDestroyContext(context_);
      context_ = nullptr;
    }
  }
  ~OffscreenContext() {
    if (context_ != nullptr) OSMesaDestroyContext(context_);
  }
  OffscreenContext(const OffscreenContext&) = delete;
  OffscreenContext& operator=(const OffscreenContext&) = delete;
  bool ok() const { return context_ != nullptr; }

 private:
  std::vector<unsigned char> pixels_;
  OSMesaContext context_ = nullptr;
};

// MuJoCo's scene and render context for one model, freed with it.
class Renderer {
 public:
  Renderer(const mjModel* m, int width, int height) : width_(width), height_(height) {
    mjv_defaultScene(&scene_);
    mjv_defaultOption(&option_);
    mjr_defaultContext(&context_);
    // The offscreen buffer's size comes from the model's visual options: a copy with ours.
    model_ = mj_copyModel(nullptr, m);
    model_->vis.global.offwidth = width;
    model_->vis.global.offheight = height;
    mjv_makeScene(model_, &scene_, 2000);
    mjr_makeContext(model_, &context_, mjFONTSCALE_100);
    mjr_setBuffer(mjFB_OFFSCREEN, &context_);
  }
  ~Renderer() {
    mjr_freeContext(&context_);
    mjv_freeScene(&scene_);
    mj_deleteModel(model_);
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  // Whether the offscreen buffer has the size asked for (MuJoCo makes a smaller one when the context cannot).
  bool ok() const { return context_.offWidth == width_ && context_.offHeight == height_; }

  // d's scene seen by `camera`, as rows of RGB from the top.
  void Render(const mjData* d, mjvCamera* camera, std::vector<unsigned char>* rgb) {
    mjv_updateScene(model_, const_cast<mjData*>(d), &option_, nullptr, camera, mjCAT_ALL, &scene_);
    const mjrRect viewport = {0, 0, width_, height_};
    mjr_render(viewport, &scene_, &context_);
    flipped_.resize(static_cast<std::size_t>(width_) * height_ * 3);
    mjr_readPixels(flipped_.data(), nullptr, viewport, &context_);  // OpenGL's rows: bottom first
    rgb->resize(flipped_.size());
    const std::size_t row = static_cast<std::size_t>(width_) * 3;
    for (int y = 0; y < height_; ++y)
      std::copy_n(flipped_.begin() + static_cast<std::ptrdiff_t>((height_ - 1 - y) * row), row,
                  rgb->begin() + static_cast<std::ptrdiff_t>(y * row));
  }

 private:
  int width_, height_;
  mjModel* model_;
  mjvScene scene_;
  mjvOption option_;
  mjrContext context_;
  std::vector<unsigned char> flipped_;
};

class FrameSink {
 public:
  virtual ~FrameSink() = default;
  virtual Status Add(const std::vector<unsigned char>& rgb) = 0;
  virtual Status Close() = 0;
};

// An animated GIF, looping, each frame quantised to its own 256 colours.
class GifSink : public FrameSink {
 public:
  static Status Open(const std::string& path, int width, int height, int delay_cs, std::unique_ptr<FrameSink>* out) {
    // Opened here, not by giflib (which makes files only their owner can read): the umask decides, as for any file.
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return Status::IoError(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
    int error = 0;
    GifFileType* gif = EGifOpenFileHandle(fd, &error);  // closes fd when closed
    if (gif == nullptr) {
      close(fd);
      return Status::IoError(fmt::format("cannot write {}: {}", path, GifErrorString(error)));
    }
    std::unique_ptr<GifSink> sink(new GifSink(gif, path, width, height, delay_cs));
    EGifSetGifVersion(gif, true);
    static const char kLoop[] = "NETSCAPE2.0";
    const unsigned char forever[3] = {1, 0, 0};
    if (EGifPutScreenDesc(gif, width, height, 8, 0, nullptr) == GIF_ERROR ||
        EGifPutExtensionLeader(gif, APPLICATION_EXT_FUNC_CODE) == GIF_ERROR ||
        EGifPutExtensionBlock(gif, 11, kLoop) == GIF_ERROR || EGifPutExtensionBlock(gif, 3, forever) == GIF_ERROR ||
        EGifPutExtensionTrailer(gif) == GIF_ERROR)
      return sink->Failed();
    *out = std::move(sink);
    return Status::Ok();
  }
  ~GifSink() override {
    if (gif_ != nullptr) EGifCloseFile(gif_, nullptr);
  }

  Status Add(const std::vector<unsigned char>& rgb) override {
    const std::size_t n = static_cast<std::size_t>(width_) * height_;
    for (std::size_t i = 0; i < n; ++i) {
      red_[i] = rgb[3 * i];
      green_[i] = rgb[3 * i + 1];
      blue_[i] = rgb[3 * i + 2];
    }
    int colors = 256;
    ColorMapObject* map = GifMakeMapObject(256, nullptr);
    if (map == nullptr) return Status::Internal("giflib: out of memory");
    std::unique_ptr<ColorMapObject, void (*)(ColorMapObject*)> owned(map, GifFreeMapObject);
    if (GifQuantizeBuffer(width_, height_, &colors, red_.data(), green_.data(), blue_.data(), index_.data(),
                          map->Colors) == GIF_ERROR)
      return Status::Internal("giflib: cannot quantise a frame");
    GraphicsControlBlock control{DISPOSAL_UNSPECIFIED, false, delay_cs_, NO_TRANSPARENT_COLOR};
    GifByteType extension[4];
    EGifGCBToExtension(&control, extension);
    if (EGifPutExtension(gif_, GRAPHICS_EXT_FUNC_CODE, 4, extension) == GIF_ERROR ||
        EGifPutImageDesc(gif_, 0, 0, width_, height_, false, map) == GIF_ERROR)
      return Failed();
    for (int y = 0; y < height_; ++y)
      if (EGifPutLine(gif_, index_.data() + static_cast<std::size_t>(y) * width_, width_) == GIF_ERROR)
        return Failed();
    return Status::Ok();
  }

  Status Close() override {
    int error = 0;
    GifFileType* gif = std::exchange(gif_, nullptr);
    if (EGifCloseFile(gif, &error) == GIF_ERROR)
      return Status::IoError(fmt::format("cannot write {}: {}", path_, GifErrorString(error)));
    return Status::Ok();
  }

 private:
  GifSink(GifFileType* gif, std::string path, int width, int height, int delay_cs)
      : gif_(gif), path_(std::move(path)), width_(width), height_(height), delay_cs_(delay_cs) {
    const std::size_t n = static_cast<std::size_t>(width) * height;
    red_.resize(n);
    green_.resize(n);
    blue_.resize(n);
    index_.resize(n);
  }
  Status Failed() const {
    return Status::IoError(fmt::format("cannot write {}: {}", path_, GifErrorString(gif_->Error)));
  }

  GifFileType* gif_;
  std::string path_;
  int width_, height_, delay_cs_;
  std::vector<GifByteType> red_, green_, blue_, index_;
};

// H.264 in an MP4 by ffmpeg, fed raw RGB frames on its standard input.
class FfmpegSink : public FrameSink {
 public:
  static Status Open(const std::string& path, int width, int height, double fps, std::unique_ptr<FrameSink>* out) {
    int fds[2];
    if (pipe(fds) != 0) return Status::IoError(fmt::format("pipe: {}", std::strerror(errno)));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[0], STDIN_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addclose(&actions, fds[1]);
    const std::string size = fmt::format("{}x{}", width, height);
    const std::string rate = fmt::format("{:.6g}", fps);
    std::vector<std::string> args = {"ffmpeg", "-hide_banner", "-loglevel", "error", "-y",  "-f",
                                     "rawvideo", "-pix_fmt", "rgb24", "-s", size, "-r", rate, "-i", "-",
                                     "-c:v", "libx264", "-pix_fmt", "yuv420p", path};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawnp(&pid, "ffmpeg", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[0]);
    if (rc != 0) {
      close(fds[1]);
      return Status::NotFound(fmt::format(
          "cannot write {}: an .mp4 is written by ffmpeg, which cannot be started ({}; Debian: apt-get install "
          "ffmpeg); a .gif needs nothing more",
          path, std::strerror(rc)));
    }
    out->reset(new FfmpegSink(path, fds[1], pid));
    return Status::Ok();
  }
  ~FfmpegSink() override { Close(); }

  Status Add(const std::vector<unsigned char>& rgb) override {
    // A write to a pipe whose reader has gone fails with EPIPE instead of killing this process: SIGPIPE is held
    // back in this thread for the write, and the one it raised is taken before it is let through again.
    sigset_t pipe_signal, old;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_signal, &old);
    std::size_t done = 0;
    int error = 0;
    while (done < rgb.size()) {
      const ssize_t n = write(fd_, rgb.data() + done, rgb.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error = errno;
        break;
      }
      done += static_cast<std::size_t>(n);
    }
    if (error == EPIPE) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_signal, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (error != 0)
      return Status::IoError(fmt::format("cannot write {}: ffmpeg stopped reading frames ({})", path_,
                                         std::strerror(error)));
    return Status::Ok();
  }

  Status Close() override {
    if (pid_ <= 0) return Status::Ok();
    close(fd_);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return Status::IoError(fmt::format("cannot write {}: ffmpeg failed (exit status {}; its message above)", path_,
                                         WIFEXITED(status) ? WEXITSTATUS(status) : -1));
    return Status::Ok();
  }

 private:
  FfmpegSink(std::string path, int fd, pid_t pid) : path_(std::move(path)), fd_(fd), pid_(pid) {}
  std::string path_;
  int fd_;
  pid_t pid_;
};

Status ChooseCamera(const mjModel* m, const Model& model, const std::string& name, mjvCamera* camera) {
  mjv_defaultCamera(camera);
  if (!name.empty()) {
    const int id = mj_name2id(m, mjOBJ_CAMERA, name.c_str());
    if (id < 0) {
      const std::vector<std::string> names = model.Names(mjOBJ_CAMERA, m->ncam);
      return Status::InvalidArgument(fmt::format("the model {} has no camera '{}'; it has: {}", model.name(), name,
                                                 names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "))));
    }
    camera->type = mjCAMERA_FIXED;
    camera->fixedcamid = id;
  } else if (m->ncam > 0) {
    camera->type = mjCAMERA_FIXED;
    camera->fixedcamid = 0;
  } else {
    // From the side (looking along +y), a little above, following the first body: a free camera whose lookat
    // WriteVideo moves to the body's centre of mass before each frame.
    camera->type = mjCAMERA_FREE;
    camera->trackbodyid = m->nbody > 1 ? 1 : 0;
    camera->distance = 3.0;
    camera->azimuth = 90;
    camera->elevation = -15;
  }
  return Status::Ok();
}

}  // namespace

Status WriteVideo(const EpisodeRecording& episode, const std::string& path, const VideoOptions& options) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext != ".gif" && ext != ".mp4")
    return Status::InvalidArgument(fmt::format("{}: expected a .gif or .mp4 file name", path));
  if (episode.size() == 0) return Status::InvalidArgument(fmt::format("{}: the episode has no recorded state", path));
  if (options.width < 16 || options.height < 16 || options.width > 4096 || options.height > 4096)
    return Status::InvalidArgument(
        fmt::format("{}: a video of {}x{} pixels; expected 16 to 4096 each", path, options.width, options.height));
  const mjModel* m = episode.model().get();
  mjvCamera camera;
  if (auto s = ChooseCamera(m, episode.model(), options.camera, &camera); !s.ok()) return s;

  // Every stride-th state, so that frames come at most max_fps per simulated second; a GIF counts its delay in
  // hundredths of a second, an MP4 in frames per second.
  const double dt = episode.dt();
  // (1e-9: a step of exactly 1/max_fps s must not round up to every other state)
  const int stride =
      std::max(1, static_cast<int>(std::ceil(options.max_fps > 0 ? 1.0 / (dt * options.max_fps) - 1e-9 : 1.0)));
  const double frame_seconds = dt * stride;
  const int frames = (episode.size() + stride - 1) / stride;

  OffscreenContext context(options.width, options.height);
  if (!context.ok())
    return Status::NotFound(
        fmt::format("cannot render {}: Mesa's OSMesa could not make an OpenGL context of {}x{}", path, options.width,
                    options.height));
  Renderer renderer(m, options.width, options.height);
  if (!renderer.ok())
    return Status::NotFound(
        fmt::format("cannot render {}: MuJoCo could not make an offscreen buffer of {}x{}", path, options.width,
                    options.height));

  std::unique_ptr<FrameSink> sink;
  const std::string tmp = path + ".tmp" + ext;  // ffmpeg picks the container from the extension
  if (ext == ".gif") {
    const int delay_cs = std::max(2, static_cast<int>(std::lround(100 * frame_seconds)));
    if (auto s = GifSink::Open(tmp, options.width, options.height, delay_cs, &sink); !s.ok()) {
      sink.reset();
      std::filesystem::remove(tmp);
      return s;
    }
  } else {
    if (auto s = FfmpegSink::Open(tmp, options.width, options.height, 1.0 / frame_seconds, &sink); !s.ok())
      return s;
  }
  std::unique_ptr<mjData, void (*)(mjData*)> data(mj_makeData(m), mj_deleteData);
  std::vector<unsigned char> rgb;
  for (int i = 0; i < episode.size(); i += stride) {
    episode.Restore(i, data.get());
    if (camera.type == mjCAMERA_FREE) mju_copy3(camera.lookat, data->subtree_com + 3 * camera.trackbodyid);
    renderer.Render(data.get(), &camera, &rgb);
    if (options.progress) options.progress(i / stride + 1, frames);
    if (auto s = sink->Add(rgb); !s.ok()) {
      sink.reset();
      std::filesystem::remove(tmp);
      return s;
    }
  }
  if (auto s = sink->Close(); !s.ok()) {
    std::filesystem::remove(tmp);
    return s;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::IoError(fmt::format("cannot write {}: {}", path, ec.message()));
  return Status::Ok();
}

#endif

}  // namespace farm::mujoco
