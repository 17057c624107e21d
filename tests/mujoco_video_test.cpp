// Seeing a MuJoCo episode: the env group's step observer sees each state up to the episode's end, the recording
// gives it back (Restore) and as a table (WriteTrace), and WriteVideo renders it offscreen into a GIF (decoded
// here with giflib) or an MP4 where ffmpeg is on PATH; the refusals say why.
#include <catch2/catch.hpp>

#include <mujoco/mujoco.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#if FARM_HAVE_RENDER
#include <gif_lib.h>
#endif

#include "env_test_util.h"
#include "temp_dir.h"
#include "worker/env_group.h"
#include "worker/envs/mujoco/mujoco_env.h"
#include "worker/envs/mujoco/recording.h"
#include "worker/envs/mujoco/video.h"

namespace farm {
namespace {

namespace fs = std::filesystem;
using testing::MakeGroup;

// A fresh folder under the system's temp dir (tests/temp_dir.h), removed at the end of the test, as a path.
struct TempDir {
  testing::TempDir dir{"farm_mujoco_video"};
  fs::path path{dir.path};
};

std::vector<std::vector<std::string>> ReadCsv(const fs::path& file) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    rows.push_back(cells);
  }
  return rows;
}

// `steps` steps of a built-in env's first env with one constant action, recorded from its reset.
std::unique_ptr<mujoco::EpisodeRecording> Record(const std::string& env, int steps, float action_value) {
  auto group = MakeGroup(env, {}, 1, 7);
  const auto& sim = dynamic_cast<const mujoco::MujocoEnv&>(group->env(0));
  auto recording = std::make_unique<mujoco::EpisodeRecording>(sim.model_handle(), sim.dt());
  recording->Add(sim.data(), 0);
  group->SetStepObserver([&](int, const Env& e, float reward, bool) {
    recording->Add(dynamic_cast<const mujoco::MujocoEnv&>(e).data(), reward);
  });
  std::vector<float> action(static_cast<std::size_t>(group->spec().action.numel()), action_value);
  for (int i = 0; i < steps; ++i) group->Step(nullptr, action.data());
  return recording;
}

TEST_CASE("EpisodeRecording: the observer sees the last state before the reset, the trace holds every state",
          "[mujoco][video]") {
  // InvertedPendulum-v4 pushed hard one way: the pole passes 0.2 rad and the episode terminates.
  auto group = MakeGroup("InvertedPendulum-v4", {}, 1, 3);
  const auto& sim = dynamic_cast<const mujoco::MujocoEnv&>(group->env(0));
  mujoco::EpisodeRecording recording(sim.model_handle(), sim.dt());
  recording.Add(sim.data(), 0);
  std::vector<double> pole_z;  // the pole body's height at each state, read from the live simulation
  pole_z.push_back(sim.data()->xpos[3 * 2 + 2]);
  bool ended = false;
  group->SetStepObserver([&](int e, const Env& env, float reward, bool end) {
    CHECK(e == 0);
    const mjData* d = dynamic_cast<const mujoco::MujocoEnv&>(env).data();
    recording.Add(d, reward);
    pole_z.push_back(d->xpos[3 * 2 + 2]);
    ended = end;
  });
  std::vector<float> push = {3.0f};
  int steps = 0;
  while (!ended && steps < 1000) {
    group->Step(nullptr, push.data());
    ++steps;
  }
  REQUIRE(ended);
  REQUIRE(recording.size() == steps + 1);
  REQUIRE(group->finished().size() == 1);

  // The last recorded state is the terminal one (the pole past 0.2 rad), not the reset that followed.
  const mjModel* m = sim.model();
  mjData* d = mj_makeData(m);
  recording.Restore(recording.size() - 1, d);
  CHECK(std::abs(d->qpos[1]) > 0.2);
  recording.Restore(0, d);
  CHECK(std::abs(d->qpos[1]) <= 0.01);  // reset noise only
  CHECK(recording.time(recording.size() - 1) == Approx(steps * sim.dt()));
  mj_deleteData(d);

  TempDir dir;
  REQUIRE(recording.WriteTrace((dir.path / "trace.csv").string()).ok());
  const auto rows = ReadCsv(dir.path / "trace.csv");
  REQUIRE(rows.size() == static_cast<std::size_t>(steps + 2));
  CHECK(rows[0] == std::vector<std::string>{"step", "time", "reward", "return", "cart_z", "cart_vx", "cart_vz",
                                            "pole_z", "pole_vx", "pole_vz"});
  for (std::size_t i = 1; i < rows.size(); ++i) {
    REQUIRE(rows[i].size() == 10);
    CHECK(std::stod(rows[i][7]) == Approx(pole_z[i - 1]).margin(1e-5));
  }
  CHECK(std::stod(rows.back()[3]) == Approx(group->finished()[0].episode_return).epsilon(1e-5));
  CHECK(std::stod(rows.back()[1]) == Approx(steps * sim.dt()).epsilon(1e-5));
  // The cart pushed along +x: its velocity at the end is forward.
  CHECK(std::stod(rows.back()[5]) > 0.1);
}

#if FARM_HAVE_RENDER

struct Gif {
  GifFileType* file = nullptr;
  explicit Gif(const fs::path& path) {
    int error = 0;
    file = DGifOpenFileName(path.c_str(), &error);
    REQUIRE(file != nullptr);
    REQUIRE(DGifSlurp(file) == GIF_OK);
  }
  ~Gif() { DGifCloseFile(file, nullptr); }
  // Frame i's pixels as RGB.
  std::vector<unsigned char> Rgb(int i) const {
    const SavedImage& image = file->SavedImages[i];
    const ColorMapObject* map = image.ImageDesc.ColorMap ? image.ImageDesc.ColorMap : file->SColorMap;
    std::vector<unsigned char> rgb;
    const int n = image.ImageDesc.Width * image.ImageDesc.Height;
    for (int p = 0; p < n; ++p) {
      const GifColorType& c = map->Colors[image.RasterBits[p]];
      rgb.insert(rgb.end(), {c.Red, c.Green, c.Blue});
    }
    return rgb;
  }
  int DelayCs(int i) const {
    GraphicsControlBlock control;
    REQUIRE(DGifSavedExtensionToGCB(file, i, &control) == GIF_OK);
    return control.DelayTime;
  }
};

double MeanAbsDifference(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += std::abs(static_cast<int>(a[i]) - static_cast<int>(b[i]));
  return sum / static_cast<double>(a.size());
}

TEST_CASE("WriteVideo: a GIF of the episode, a frame per state up to max_fps, the robot seen moving",
          "[mujoco][video]") {
  TempDir dir;
  mujoco::VideoOptions options;
  options.width = 96;
  options.height = 72;
  int progress_calls = 0;
  options.progress = [&](int frame, int frames) {
    ++progress_calls;
    CHECK(frame == progress_calls);
    CHECK(frames == 12);
  };
  // HalfCheetah-v4 acts at 20 Hz (5 x 0.01 s): every state is a frame, 5 hundredths of a second apart.
  auto cheetah = Record("HalfCheetah-v4", 11, 1.0f);
  const fs::path gif_path = dir.path / "cheetah.gif";
  const Status s = mujoco::WriteVideo(*cheetah, gif_path.string(), options);
  REQUIRE(s.ok());
  CHECK(progress_calls == 12);
  CHECK_FALSE(fs::exists(gif_path.string() + ".tmp.gif"));
  {
    Gif gif(gif_path);
    REQUIRE(gif.file->ImageCount == 12);
    CHECK(gif.file->SWidth == 96);
    CHECK(gif.file->SHeight == 72);
    CHECK(gif.DelayCs(0) == 5);
    const auto first = gif.Rgb(0), last = gif.Rgb(11);
    // Something is drawn (not one flat colour), and the robot moved between the first frame and the last.
    std::vector<int> distinct(256 * 256 * 256 / 64, 0);
    int colours = 0;
    for (std::size_t p = 0; p + 2 < first.size(); p += 3) {
      const int key = ((first[p] >> 2) << 12) | ((first[p + 1] >> 2) << 6) | (first[p + 2] >> 2);
      if (distinct[key / 64] == 0) ++colours;
      distinct[key / 64] = 1;
    }
    CHECK(colours > 8);
    CHECK(MeanAbsDifference(first, last) > 1.0);
    // The same state rendered twice gives the same picture.
    CHECK(MeanAbsDifference(gif.Rgb(3), gif.Rgb(3)) == 0.0);
  }
  // Hopper-v4 acts at 125 Hz (4 x 0.002 s): above 30 frames a second, every 5th state is a frame, 4 cs apart.
  auto hopper = Record("Hopper-v4", 10, 0.5f);
  options.progress = nullptr;
  REQUIRE(mujoco::WriteVideo(*hopper, (dir.path / "hopper.gif").string(), options).ok());
  Gif hop(dir.path / "hopper.gif");
  CHECK(hop.file->ImageCount == 3);  // states 0, 5, 10
  CHECK(hop.DelayCs(0) == 4);

  // A model without a camera is filmed by one that follows its first body: the falling box is seen to fall.
  std::shared_ptr<const mujoco::Model> box;
  REQUIRE(mujoco::Model::FromText("box.xml", R"(<mujoco><worldbody><light pos="0 0 3"/>
      <geom type="plane" size="5 5 0.1" rgba="0.3 0.5 0.3 1"/>
      <body name="box" pos="0 0 1"><freejoint/><geom type="box" size="0.1 0.1 0.1" rgba="0.9 0.1 0.1 1"/></body>
      </worldbody></mujoco>)", &box).ok());
  mujoco::EpisodeRecording fall(box, 0.1);
  mjData* d = mj_makeData(box->get());
  mj_forward(box->get(), d);
  fall.Add(d, 0);
  while (d->time < 0.4) mj_step(box->get(), d);
  fall.Add(d, 0);
  mj_deleteData(d);
  REQUIRE(mujoco::WriteVideo(fall, (dir.path / "box.gif").string(), options).ok());
  Gif box_gif(dir.path / "box.gif");
  REQUIRE(box_gif.file->ImageCount == 2);
  // The camera follows the box down: the red box is in the middle of both pictures, a metre apart in height.
  for (int frame = 0; frame < 2; ++frame) {
    const auto rgb = box_gif.Rgb(frame);
    double x = 0, y = 0, n = 0;
    for (int p = 0; p < options.width * options.height; ++p) {
      const unsigned char* c = rgb.data() + 3 * p;
      if (c[0] > c[1] + 50 && c[0] > c[2] + 50) {  // red
        x += p % options.width;
        y += p / options.width;
        n += 1;
      }
    }
    INFO("frame " << frame << ": " << n << " red pixels about (" << x / n << ", " << y / n << ")");
    REQUIRE(n > 10);
    CHECK(std::abs(x / n - options.width / 2.0) < options.width / 8.0);
    CHECK(std::abs(y / n - options.height / 2.0) < options.height / 8.0);
  }
}

TEST_CASE("WriteVideo: an MP4 by ffmpeg where it is on PATH, else a refusal that names it", "[mujoco][video]") {
  TempDir dir;
  auto cheetah = Record("HalfCheetah-v4", 5, 1.0f);
  mujoco::VideoOptions options;
  options.width = 64;
  options.height = 48;
  const fs::path mp4 = dir.path / "cheetah.mp4";
  const Status s = mujoco::WriteVideo(*cheetah, mp4.string(), options);
  if (std::system("command -v ffmpeg > /dev/null 2>&1") == 0) {
    REQUIRE(s.ok());
    std::ifstream in(mp4, std::ios::binary);
    char head[8] = {};
    in.read(head, 8);
    CHECK(std::string(head + 4, 4) == "ftyp");  // an ISO media file's first box
  } else {
    CHECK(s.code() == Status::Code::kNotFound);
    CHECK_THAT(s.message(), Catch::Contains("ffmpeg") && Catch::Contains(".gif needs nothing more"));
    CHECK_FALSE(fs::exists(mp4));
  }
}

#else

TEST_CASE("WriteVideo without a renderer says what to install", "[mujoco][video]") {
  auto cheetah = Record("HalfCheetah-v4", 2, 1.0f);
  const Status s = mujoco::WriteVideo(*cheetah, "/tmp/never.gif");
  CHECK(s.code() == Status::Code::kNotFound);
  CHECK_THAT(s.message(), Catch::Contains("libosmesa6-dev libgif-dev"));
}

#endif

TEST_CASE("WriteVideo refusals: the file name, the camera", "[mujoco][video]") {
  auto cheetah = Record("HalfCheetah-v4", 2, 1.0f);
  CHECK_THAT(mujoco::WriteVideo(*cheetah, "/tmp/x.avi").message(), Catch::Contains("expected a .gif or .mp4"));
#if FARM_HAVE_RENDER
  mujoco::VideoOptions options;
  options.camera = "overhead";
  CHECK_THAT(mujoco::WriteVideo(*cheetah, "/tmp/x.gif", options).message(),
             Catch::Contains("no camera 'overhead'") && Catch::Contains("track"));
#endif
}

}  // namespace
}  // namespace farm
