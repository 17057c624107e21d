// mujoco_gymnasium_check: checks that one of the project's MJCF models is
// physically the same as Gymnasium's asset it was written from.
//
// Usage:
//   mujoco_gymnasium_check OURS.xml THEIRS.xml [steps]
//
// Both files are compiled with MuJoCo (mj_loadXML; a load error is printed and
// the exit status is 2). The compiled models are then compared field by field:
// the physics options, the element counts, and the per-element arrays that
// decide the dynamics (masses and inertias, body/geom/joint frames, geom shape,
// friction and contact settings, joint and dof parameters, actuator gear,
// control range and transmission, qpos0) plus the element names, so bodies,
// joints, geoms, sites and actuators must appear in the same order in both
// files. Doubles match when |a-b| <= 1e-9 + 1e-6*max(|a|,|b|); integers and
// names must be equal. Every mismatch is printed on its own line with the field,
// the index and both values. When a count differs, the arrays sized by it are
// skipped (the count mismatch is the reported failure).
//
// Then both models are rolled out: from qpos0 plus a uniform +-0.1 perturbation
// of qpos and qvel, the same uniform random actions in [-1,1] (clipped to the
// control range where it is limited) are applied for `steps` mj_step calls
// (default 300). All random numbers come from one std::mt19937_64 seeded with 1
// and are drawn once and fed identically to both models. The largest absolute
// difference of qpos and qvel over the whole rollout must be <= 1e-6.
//
// On success it prints "OK <name>: N fields, S steps, max |dqpos| X" (name is
// OURS' file name without directory and .xml) and exits 0; any mismatch gives
// exit status 1.
//
// Build:
//   g++ -O2 -std=c++17 tests/mujoco_gymnasium_check.cpp -lmujoco -o /tmp/mgc
//
// It is run by a ctest test only when a Gymnasium source tree is at hand
// (prepared by scripts/prepare_gymnasium.sh), once per model in
// worker/envs/mujoco/models/. It is never a CI dependency: without Gymnasium's
// files there is nothing to compare against and the test is not registered.
#include <mujoco/mujoco.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

struct Checker {
  const mjModel* a;  // ours
  const mjModel* b;  // theirs
  int fields = 0;
  int mismatches = 0;

  static bool Close(double x, double y) {
    if (x == y) return true;  // also covers equal infinities
    const double scale = std::max(std::fabs(x), std::fabs(y));
    return std::fabs(x - y) <= 1e-9 + 1e-6 * scale;  // false for NaN
  }

  void Fail(const std::string& line) {
    ++mismatches;
    std::printf("MISMATCH %s\n", line.c_str());
  }

  // A count; returns whether the arrays sized by it can be compared.
  bool Count(const char* name, int x, int y) {
    ++fields;
    if (x == y) return true;
    Fail(std::string(name) + ": ours " + std::to_string(x) + ", theirs " + std::to_string(y) +
         " (arrays sized by " + name + " are skipped)");
    return false;
  }

  // "name[i][k]" for an element array of rows of `width`; n < 0 marks a single
  // option value or vector (|n| == 1), printed as "name" or "name[k]".
  static std::string Where(const char* name, int n, int width, int i, int k) {
    std::string w = name;
    if (n >= 0) w += "[" + std::to_string(i) + "]";
    if (width > 1) w += "[" + std::to_string(k) + "]";
    return w;
  }

  // Compares the first `use` (default: all) of each row's `width` doubles.
  void Doubles(const char* name, const mjtNum* x, const mjtNum* y, int n, int width,
               int use = -1) {
    ++fields;
    if (use < 0) use = width;
    for (int i = 0; i < std::abs(n); ++i) {
      for (int k = 0; k < use; ++k) {
        const double u = x[i * width + k];
        const double v = y[i * width + k];
        if (!Close(u, v)) {
          char buf[128];
          std::snprintf(buf, sizeof buf, ": ours %.17g, theirs %.17g", u, v);
          Fail(Where(name, n, width, i, k) + buf);
        }
      }
    }
  }

  template <typename T>
  void Ints(const char* name, const T* x, const T* y, int n, int width = 1) {
    ++fields;
    for (int i = 0; i < std::abs(n) * width; ++i) {
      if (x[i] != y[i]) {
        Fail(Where(name, n, width, i / width, i % width) + ": ours " +
             std::to_string(static_cast<long long>(x[i])) + ", theirs " +
             std::to_string(static_cast<long long>(y[i])));
      }
    }
  }

  void Names(const char* name, int type, int n) {
    ++fields;
    for (int i = 0; i < n; ++i) {
      const char* u = mj_id2name(a, type, i);
      const char* v = mj_id2name(b, type, i);
      const std::string su = u ? u : "";
      const std::string sv = v ? v : "";
      if (su != sv) {
        Fail(std::string(name) + "[" + std::to_string(i) + "]: ours \"" + su + "\", theirs \"" +
             sv + "\"");
      }
    }
  }

  void Option() {
    const mjOption& x = a->opt;
    const mjOption& y = b->opt;
    Doubles("opt.timestep", &x.timestep, &y.timestep, -1, 1);
    Doubles("opt.gravity", x.gravity, y.gravity, -1, 3);
    Doubles("opt.wind", x.wind, y.wind, -1, 3);
    Doubles("opt.density", &x.density, &y.density, -1, 1);
    Doubles("opt.viscosity", &x.viscosity, &y.viscosity, -1, 1);
    Doubles("opt.impratio", &x.impratio, &y.impratio, -1, 1);
    Doubles("opt.tolerance", &x.tolerance, &y.tolerance, -1, 1);
    Ints("opt.integrator", &x.integrator, &y.integrator, -1);
    Ints("opt.cone", &x.cone, &y.cone, -1);
    Ints("opt.jacobian", &x.jacobian, &y.jacobian, -1);
    Ints("opt.solver", &x.solver, &y.solver, -1);
    Ints("opt.iterations", &x.iterations, &y.iterations, -1);
    Ints("opt.disableflags", &x.disableflags, &y.disableflags, -1);
    Ints("opt.enableflags", &x.enableflags, &y.enableflags, -1);
  }

  void Model() {
    Option();
    const bool q = Count("nq", a->nq, b->nq);
    const bool v = Count("nv", a->nv, b->nv);
    const bool u = Count("nu", a->nu, b->nu);
    const bool bod = Count("nbody", a->nbody, b->nbody);
    const bool j = Count("njnt", a->njnt, b->njnt);
    const bool g = Count("ngeom", a->ngeom, b->ngeom);
    const bool s = Count("nsite", a->nsite, b->nsite);
    Count("ntendon", a->ntendon, b->ntendon);
    Count("neq", a->neq, b->neq);
    Count("npair", a->npair, b->npair);
    Count("nexclude", a->nexclude, b->nexclude);
    Count("nmocap", a->nmocap, b->nmocap);

    if (q) {
      Doubles("qpos0", a->qpos0, b->qpos0, a->nq, 1);
      Doubles("qpos_spring", a->qpos_spring, b->qpos_spring, a->nq, 1);
    }
    if (bod) {
      Names("body_name", mjOBJ_BODY, a->nbody);
      Ints("body_parentid", a->body_parentid, b->body_parentid, a->nbody);
      Doubles("body_mass", a->body_mass, b->body_mass, a->nbody, 1);
      Doubles("body_inertia", a->body_inertia, b->body_inertia, a->nbody, 3);
      Doubles("body_pos", a->body_pos, b->body_pos, a->nbody, 3);
      Doubles("body_quat", a->body_quat, b->body_quat, a->nbody, 4);
      Doubles("body_ipos", a->body_ipos, b->body_ipos, a->nbody, 3);
      Doubles("body_iquat", a->body_iquat, b->body_iquat, a->nbody, 4);
    }
    if (j) {
      Names("jnt_name", mjOBJ_JOINT, a->njnt);
      if (bod) Ints("jnt_bodyid", a->jnt_bodyid, b->jnt_bodyid, a->njnt);
      Ints("jnt_type", a->jnt_type, b->jnt_type, a->njnt);
      Ints("jnt_limited", a->jnt_limited, b->jnt_limited, a->njnt);
      Doubles("jnt_range", a->jnt_range, b->jnt_range, a->njnt, 2);
      Doubles("jnt_stiffness", a->jnt_stiffness, b->jnt_stiffness, a->njnt, 1);
      Doubles("jnt_pos", a->jnt_pos, b->jnt_pos, a->njnt, 3);
      Doubles("jnt_axis", a->jnt_axis, b->jnt_axis, a->njnt, 3);
      Doubles("jnt_margin", a->jnt_margin, b->jnt_margin, a->njnt, 1);
      Doubles("jnt_solref", a->jnt_solref, b->jnt_solref, a->njnt, mjNREF);
      Doubles("jnt_solimp", a->jnt_solimp, b->jnt_solimp, a->njnt, mjNIMP);
    }
    if (v) {
      Doubles("dof_damping", a->dof_damping, b->dof_damping, a->nv, 1);
      Doubles("dof_armature", a->dof_armature, b->dof_armature, a->nv, 1);
      Doubles("dof_frictionloss", a->dof_frictionloss, b->dof_frictionloss, a->nv, 1);
    }
    if (g) {
      Names("geom_name", mjOBJ_GEOM, a->ngeom);
      if (bod) Ints("geom_bodyid", a->geom_bodyid, b->geom_bodyid, a->ngeom);
      Ints("geom_type", a->geom_type, b->geom_type, a->ngeom);
      Doubles("geom_size", a->geom_size, b->geom_size, a->ngeom, 3);
      Doubles("geom_pos", a->geom_pos, b->geom_pos, a->ngeom, 3);
      Doubles("geom_quat", a->geom_quat, b->geom_quat, a->ngeom, 4);
      Doubles("geom_friction", a->geom_friction, b->geom_friction, a->ngeom, 3);
      Ints("geom_contype", a->geom_contype, b->geom_contype, a->ngeom);
      Ints("geom_conaffinity", a->geom_conaffinity, b->geom_conaffinity, a->ngeom);
      Ints("geom_condim", a->geom_condim, b->geom_condim, a->ngeom);
      Ints("geom_priority", a->geom_priority, b->geom_priority, a->ngeom);
      Doubles("geom_margin", a->geom_margin, b->geom_margin, a->ngeom, 1);
      Doubles("geom_gap", a->geom_gap, b->geom_gap, a->ngeom, 1);
      Doubles("geom_solmix", a->geom_solmix, b->geom_solmix, a->ngeom, 1);
      Doubles("geom_solref", a->geom_solref, b->geom_solref, a->ngeom, mjNREF);
      Doubles("geom_solimp", a->geom_solimp, b->geom_solimp, a->ngeom, mjNIMP);
      Doubles("geom_fluid", a->geom_fluid, b->geom_fluid, a->ngeom, mjNFLUID);
    }
    if (s) {
      Names("site_name", mjOBJ_SITE, a->nsite);
      if (bod) Ints("site_bodyid", a->site_bodyid, b->site_bodyid, a->nsite);
      Doubles("site_pos", a->site_pos, b->site_pos, a->nsite, 3);
      Doubles("site_quat", a->site_quat, b->site_quat, a->nsite, 4);
    }
    if (u) {
      Names("actuator_name", mjOBJ_ACTUATOR, a->nu);
      Ints("actuator_trntype", a->actuator_trntype, b->actuator_trntype, a->nu);
      Ints("actuator_trnid", a->actuator_trnid, b->actuator_trnid, a->nu, 2);
      Ints("actuator_dyntype", a->actuator_dyntype, b->actuator_dyntype, a->nu);
      Ints("actuator_gaintype", a->actuator_gaintype, b->actuator_gaintype, a->nu);
      Ints("actuator_biastype", a->actuator_biastype, b->actuator_biastype, a->nu);
      Doubles("actuator_gear", a->actuator_gear, b->actuator_gear, a->nu, 6, 1);
      Doubles("actuator_gainprm", a->actuator_gainprm, b->actuator_gainprm, a->nu, mjNGAIN);
      Doubles("actuator_biasprm", a->actuator_biasprm, b->actuator_biasprm, a->nu, mjNBIAS);
      Ints("actuator_ctrllimited", a->actuator_ctrllimited, b->actuator_ctrllimited, a->nu);
      Doubles("actuator_ctrlrange", a->actuator_ctrlrange, b->actuator_ctrlrange, a->nu, 2);
      Ints("actuator_forcelimited", a->actuator_forcelimited, b->actuator_forcelimited, a->nu);
      Doubles("actuator_forcerange", a->actuator_forcerange, b->actuator_forcerange, a->nu, 2);
    }
  }
};

// Uniform double in [lo, hi) from the top 53 bits of one draw, so the numbers do
// not depend on the standard library's distribution implementation.
double Uniform(std::mt19937_64& rng, double lo, double hi) {
  const double unit = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
  return lo + (hi - lo) * unit;
}

struct Rollout {
  std::vector<double> qpos_noise, qvel_noise, actions;  // actions: steps x nu
};

// Steps model m from the perturbed qpos0 and records qpos/qvel after each step.
bool Run(const mjModel* m, const Rollout& r, int steps, std::vector<double>* trace) {
  mjData* d = mj_makeData(m);
  if (!d) return false;
  for (int i = 0; i < m->nq; ++i) d->qpos[i] = m->qpos0[i] + r.qpos_noise[i];
  for (int i = 0; i < m->nv; ++i) d->qvel[i] = r.qvel_noise[i];
  mj_forward(m, d);
  trace->clear();
  trace->reserve(static_cast<std::size_t>(steps) * (m->nq + m->nv));
  for (int t = 0; t < steps; ++t) {
    for (int k = 0; k < m->nu; ++k) {
      double c = r.actions[static_cast<std::size_t>(t) * m->nu + k];
      if (m->actuator_ctrllimited[k]) {
        c = std::min(std::max(c, m->actuator_ctrlrange[2 * k]), m->actuator_ctrlrange[2 * k + 1]);
      }
      d->ctrl[k] = c;
    }
    mj_step(m, d);
    trace->insert(trace->end(), d->qpos, d->qpos + m->nq);
    trace->insert(trace->end(), d->qvel, d->qvel + m->nv);
  }
  mj_deleteData(d);
  return true;
}

std::string Stem(const std::string& path) {
  std::string s = path.substr(path.find_last_of('/') + 1);  // npos + 1 == 0
  if (s.size() > 4 && s.compare(s.size() - 4, 4, ".xml") == 0) s.resize(s.size() - 4);
  return s;
}

mjModel* Load(const char* path) {
  char error[1024] = "";
  mjModel* m = mj_loadXML(path, nullptr, error, sizeof error);
  if (!m) std::fprintf(stderr, "cannot load %s: %s\n", path, error);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s OURS.xml THEIRS.xml [steps]\n", argv[0]);
    return 2;
  }
  int steps = 300;
  if (argc == 4) {
    char* end = nullptr;
    const long s = std::strtol(argv[3], &end, 10);
    if (*argv[3] == '\0' || *end != '\0' || s < 0 || s > 100000000) {
      std::fprintf(stderr, "bad steps: %s\n", argv[3]);
      return 2;
    }
    steps = static_cast<int>(s);
  }

  mjModel* ours = Load(argv[1]);
  if (!ours) return 2;
  mjModel* theirs = Load(argv[2]);
  if (!theirs) {
    mj_deleteModel(ours);
    return 2;
  }

  Checker c{ours, theirs};
  c.Model();

  double max_dqpos = 0.0, max_dqvel = 0.0;
  const bool same_shape = ours->nq == theirs->nq && ours->nv == theirs->nv && ours->nu == theirs->nu;
  if (!same_shape) {
    std::printf("MISMATCH rollout skipped: nq/nv/nu differ\n");
    ++c.mismatches;
  } else {
    // One generator, drawn once; both models get exactly these numbers.
    std::mt19937_64 rng(1);
    Rollout r;
    for (int i = 0; i < ours->nq; ++i) r.qpos_noise.push_back(Uniform(rng, -0.1, 0.1));
    for (int i = 0; i < ours->nv; ++i) r.qvel_noise.push_back(Uniform(rng, -0.1, 0.1));
    for (long i = 0; i < static_cast<long>(steps) * ours->nu; ++i) {
      r.actions.push_back(Uniform(rng, -1.0, 1.0));
    }
    std::vector<double> ta, tb;
    if (!Run(ours, r, steps, &ta) || !Run(theirs, r, steps, &tb)) {
      std::printf("MISMATCH rollout: mj_makeData failed\n");
      ++c.mismatches;
    } else {
      const int stride = ours->nq + ours->nv;
      int worst_step = -1;
      double worst = 0.0;
      for (int t = 0; t < steps; ++t) {
        for (int i = 0; i < stride; ++i) {
          const std::size_t at = static_cast<std::size_t>(t) * stride + i;
          double diff = std::fabs(ta[at] - tb[at]);
          if (std::isnan(diff)) diff = INFINITY;
          double& slot = i < ours->nq ? max_dqpos : max_dqvel;
          slot = std::max(slot, diff);
          if (diff > worst) {
            worst = diff;
            worst_step = t;
          }
        }
      }
      if (!(max_dqpos <= 1e-6) || !(max_dqvel <= 1e-6)) {
        std::printf(
            "MISMATCH rollout: max |dqpos| %.3g, max |dqvel| %.3g over %d steps "
            "(largest at step %d)\n",
            max_dqpos, max_dqvel, steps, worst_step + 1);
        ++c.mismatches;
      }
    }
  }

  const std::string name = Stem(argv[1]);
  int rc = 0;
  if (c.mismatches == 0) {
    std::printf("OK %s: %d fields, %d steps, max |dqpos| %.3g, max |dqvel| %.3g\n", name.c_str(),
                c.fields, steps, max_dqpos, max_dqvel);
  } else {
    std::printf("FAIL %s: %d mismatches\n", name.c_str(), c.mismatches);
    rc = 1;
  }
  mj_deleteModel(ours);
  mj_deleteModel(theirs);
  return rc;
}
