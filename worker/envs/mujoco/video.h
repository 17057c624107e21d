// An episode of a MuJoCo env as a video: its recorded states (recording.h) rendered offscreen by MuJoCo's own
// renderer in a software OpenGL context (Mesa's OSMesa: no display, no GPU), written as an animated GIF (giflib)
// or, where ffmpeg is on PATH, as an H.264 MP4.
//
// Threading: call from one thread at a time (each call makes and destroys its own OpenGL context).
#pragma once

#include <functional>
#include <string>

#include "common/status.h"
#include "worker/envs/mujoco/recording.h"

namespace farm::mujoco {

struct VideoOptions {
  int width = 480;
  int height = 360;
  // A camera of the model by name; empty: the model's first camera, or, where it has none, a camera 3 m to the
  // side of the first body (looking along +y), following its centre of mass.
  std::string camera;
  // At most this many frames per second of simulated time: states are skipped evenly above it (a GIF's frame
  // delay is counted in hundredths of a second).
  double max_fps = 30;
  // Called before each frame is rendered with (frames rendered so far + 1, frames in all); empty: not called.
  std::function<void(int frame, int frames)> progress;
};

// Renders every recorded state (fewer above max_fps) and writes `path`: .gif or .mp4. Fails, saying why, where
// no OpenGL context can be had, where an .mp4 is asked for without ffmpeg, or for another extension.
Status WriteVideo(const EpisodeRecording& episode, const std::string& path, const VideoOptions& options = {});

}  // namespace farm::mujoco
