"""Checks that examples/models/encoders.py's FarmCnn / FarmImpala are the farm's built-in cnn / impala encoders.

Usage: encoders_match.py KIND POLICY.pt CHECK.json [STAGE_CHANNELS ...]
POLICY.pt and CHECK.json come from farm-export (--check-file) of a run with ppo.encoder KIND (and
ppo.impala_channels STAGE_CHANNELS for impala) and ppo.activation tanh. The exported module holds the built-in
encoder's parameters (enc<i>_w, enc<i>_b, registered in the encoder's layer order) and the trunk's and head's
(actor<i>_w, actor<i>_b). They are loaded, in order and shape for shape, into the example's module; the trunk and
head are applied after it (tanh between, none after the head), and the argmax must be the C++ policy's action for
every check observation, and the exported module's with a random trunk and head. A name, shape or count that differs, or a
forward that differs, fails; so does an initialisation (the example's farm_init) whose tensors' norms are not the
built-in encoder's after its one update."""
import importlib.util
import json
import os
import sys

import torch


def main():
    kind, policy_path, check_path = sys.argv[1:4]
    stages = [int(c) for c in sys.argv[4:]]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("encoders", os.path.join(root, "examples/models/encoders.py"))
    encoders = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(encoders)

    exported = torch.jit.load(policy_path)
    params = dict(exported.named_parameters())
    enc = [(n, p) for n, p in params.items() if n.startswith("enc")]
    actor = [(n, p) for n, p in params.items() if n.startswith("actor")]
    assert enc and actor, f"the export has no enc* or actor* parameters: {list(params)}"
    check = json.load(open(check_path))
    shape = check["obs_shape"]
    features = enc[-1][1].shape[0]  # the encoder's last Linear
    if kind == "impala":
        module = encoders.FarmImpala(shape, features, stages)
    elif kind == "cnn":
        module = encoders.FarmCnn(shape, features)
    else:
        raise SystemExit(f"kind: expected cnn or impala, got {kind}")
    mine = list(module.named_parameters())
    assert len(mine) == len(enc), (
        f"{kind}: the example has {len(mine)} parameter tensors, the built-in encoder {len(enc)}:\n"
        f"  example:  {[(n, tuple(p.shape)) for n, p in mine]}\n  built-in: {[(n, tuple(p.shape)) for n, p in enc]}")
    torch.manual_seed(0)
    encoders.farm_init(module)
    with torch.no_grad():
        for (name, p), (enc_name, q) in zip(mine, enc):
            assert p.shape == q.shape, f"{kind}: {name} {tuple(p.shape)} against the built-in {enc_name} {tuple(q.shape)}"
            # farm_init starts as the farm does: an orthogonal tensor's norm is its gain x sqrt(min(rows, columns)),
            # whatever the seed, and the run's 4 Adam steps at lr 5e-4 moved the export's by a little (a zero
            # tensor's to at most 2e-3 x sqrt(numel)); a gain of 1 against sqrt(2), or zero against either, differs.
            mine_norm, built_in_norm = p.norm().item(), q.norm().item()
            assert abs(mine_norm - built_in_norm) <= 0.1 * mine_norm + 2e-3 * q.numel() ** 0.5, (
                f"{kind}: farm_init starts {name} at norm {mine_norm:.3f}, the built-in {enc_name} was at "
                f"{built_in_norm:.3f} after one update")
            p.copy_(q)
        x = torch.tensor(check["inputs"], dtype=torch.float32).reshape(-1, *shape)
        h = module(x)
        weights = [p for n, p in actor if n.endswith("_w")]
        biases = [p for n, p in actor if n.endswith("_b")]
        for i, (w, b) in enumerate(zip(weights, biases)):
            h = torch.addmm(b, h, w.t())
            if i + 1 < len(weights):
                h = torch.tanh(h)
        actions = torch.argmax(h, -1)
        assert actions.tolist() == check["actions"], (
            f"{kind}: the example's actions differ from the built-in policy's in "
            f"{sum(a != b for a, b in zip(actions.tolist(), check['actions']))} of {len(check['actions'])} rows")
        counts = [actions.tolist().count(a) for a in range(h.shape[1])]
        # A fresh policy's logits are close and one action wins most rows, so the argmax alone says little about
        # the features: the same comparison again with the trunk's and head's weights drawn at random (seeded),
        # the first layer scaled and centred on the features' spread so that every action wins some rows,
        # through the exported module itself (the C++ policy's forward, as tests/export_test.sh checks) and
        # through the example.
        generator = torch.Generator().manual_seed(7)
        feats = module(x)
        mean, std = feats.mean(0), feats.std(0) + 1e-6
        for trial in range(8):
            for i, (w, b) in enumerate(zip(weights, biases)):
                w.copy_(torch.randn(w.shape, generator=generator) / w.shape[1] ** 0.5)
                b.zero_()
                if i == 0:
                    w.div_(std)
                    b.copy_(-(w @ mean))
            h = module(x)
            for i, (w, b) in enumerate(zip(weights, biases)):
                h = torch.addmm(b, h, w.t())
                if i + 1 < len(weights):
                    h = torch.tanh(h)
            assert torch.argmax(h, -1).tolist() == exported(x).tolist(), (
                f"{kind}: with random head {trial} the example's actions differ from the exported policy's")
        spread = [torch.argmax(h, -1).tolist().count(a) for a in range(h.shape[1])]
    print(f"ok: {kind} {stages or ''} on {shape}: {len(enc)} encoder tensors ({sum(p.numel() for _, p in enc)} "
          f"parameters) matched by order and shape; the argmax of {len(actions)} observations equal to the C++ "
          f"policy's (actions {counts}), and to the export's with 8 random trunks and heads (the last: actions {spread})")


if __name__ == "__main__":
    main()
