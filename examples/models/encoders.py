#!/usr/bin/env python3
"""Encoders written in PyTorch for the farm (ppo.actor_encoder_script / ppo.critic_encoder_script).

An encoder is any torch.nn.Module whose forward takes a float32 batch [B, *shape] (the actor's observation, or
the critic's input: the env's global state when it has one) and returns features [B, F]. Script it with
torch.jit.script and save it; the learner loads the file, puts the farm's trunk (ppo.hidden_sizes, ppo.activation),
recurrent core (ppo.core) and heads after it, and trains all of it with PPO. The script's parameters are
checkpointed, resumed, exported (farm-export) and served with the rest; the learner keeps a copy of the file in
the run directory. Initialise your layers in __init__ as you like: the farm initialises only its own.

Usage (Debian's python3-torch; its TorchScript files load in the farm's LibTorch):
  python3 examples/models/encoders.py cnn --shape 5 7 7 --features 128 --out actor_encoder.pt
  python3 examples/models/encoders.py cnn --shape 3 32 32 --features 128 --out critic_encoder.pt
  python3 examples/models/encoders.py mlp --shape 4 --features 64 --out cartpole_encoder.pt
  python3 examples/models/encoders.py impala --shape 5 7 7 --channels 16 32 --features 128 --out impala.pt
then `--set ppo.actor_encoder_script=actor_encoder.pt --set ppo.critic_encoder_script=critic_encoder.pt`;
examples/models/uav_scripted.yaml trains uav_coverage through two cnn scripts (its header says how to make them).
"""
import argparse

import torch
from torch import nn


class FarmCnn(nn.Module):
    """The farm's built-in cnn encoder (ppo.encoder: cnn) written in PyTorch: conv 3x3 C->32 (padding 1), ReLU,
    conv 3x3 stride 2 32->64 (padding 1), ReLU, flatten, Linear -> features, ReLU.

    With ppo.hidden_sizes [H] and ppo.activation as the built-in run's, a run with this script is the built-in
    cnn run with ppo.hidden_sizes [features, H] (the built-in cnn ends in its Linear to hidden_sizes[0]; a script
    is followed by every hidden size)."""

    def __init__(self, shape, features):
        super().__init__()
        channels, height, width = shape
        self.conv = nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten())
        out_h, out_w = (height + 1) // 2, (width + 1) // 2
        self.linear = nn.Linear(64 * out_h * out_w, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(self.conv(x)))


class ImpalaBlock(nn.Module):
    """A residual block of the IMPALA ResNet: x + conv(relu(conv(relu(x)))), 3x3 convs that keep the channels."""

    def __init__(self, channels):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class FarmImpala(nn.Module):
    """The farm's built-in impala encoder (ppo.encoder: impala, ppo.impala_channels) written in PyTorch: per stage
    a conv 3x3 (padding 1), a max-pool 3x3 stride 2 (padding 1) and two residual blocks; then ReLU, flatten,
    Linear -> features, ReLU. As with FarmCnn, a run with this script and ppo.hidden_sizes [H] is the built-in
    impala run with ppo.hidden_sizes [features, H]."""

    def __init__(self, shape, features, stages):
        super().__init__()
        channels, height, width = shape
        layers = []
        for out in stages:
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       ImpalaBlock(out), ImpalaBlock(out)]
            channels, height, width = out, (height + 1) // 2, (width + 1) // 2
        self.stages = nn.Sequential(*layers, nn.ReLU(), nn.Flatten())
        self.linear = nn.Linear(channels * height * width, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(self.stages(x)))


class Mlp(nn.Module):
    """A Linear to `features` and tanh on the flattened input (vector observations: CartPole's [4])."""

    def __init__(self, shape, features):
        super().__init__()
        numel = 1
        for d in shape:
            numel *= d
        self.linear = nn.Linear(numel, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x.flatten(1)))


def farm_init(module):
    """Orthogonal weights with gain sqrt(2) and zero biases for every Linear and Conv2d (a conv's weight on its
    [out, in * k * k] view), FarmImpala's residual stack aside (below), as the farm initialises its own hidden
    layers (learner/model/encoder.h). A script keeps the weights it was saved with, so this is how a scripted
    copy of a built-in encoder starts where the built-in one does: on
    uav_coverage at 300k env steps FarmCnn covered a median 352 cells with PyTorch's default initialisation and
    620 with this one, against the built-in cnn's 523 (records/performance-history.md, "uav_coverage
    learning")."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(m.weight, gain=2 ** 0.5)
            nn.init.zeros_(m.bias)
    # FarmImpala's residual stack keeps the stream's scale, as the built-in impala's does: every block starts as the
    # identity (its second conv zero) and the stage convs, which read the stream and not a ReLU's output, take gain 1.
    for m in module.modules():
        if isinstance(m, ImpalaBlock):
            nn.init.zeros_(m.conv1.weight)
            nn.init.zeros_(m.conv1.bias)
        elif isinstance(m, FarmImpala):
            for layer in m.stages:
                if isinstance(layer, nn.Conv2d):
                    nn.init.orthogonal_(layer.weight, gain=1.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["cnn", "impala", "mlp"])
    parser.add_argument("--shape", type=int, nargs="+", required=True, help="the input's shape, without the batch")
    parser.add_argument("--features", type=int, required=True, help="F, the width of the features")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed for the initial weights")
    parser.add_argument("--init", choices=["farm", "torch"], default="farm",
                        help="farm: orthogonal weights (gain sqrt 2; impala's stage convs 1, its blocks' second convs "
                             "zero) and zero biases, as the farm initialises its own layers (the built-in "
                             "encoders); torch: PyTorch's defaults")
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 32, 32],
                        help="impala: the channels of each stage (ppo.impala_channels), default 16 32 32")
    parser.add_argument("--out", required=True, help="the TorchScript file to write")
    args = parser.parse_args()
    if args.kind in ("cnn", "impala") and len(args.shape) != 3:
        parser.error(f"{args.kind} takes a [C, H, W] input, got --shape {args.shape}")
    torch.manual_seed(args.seed)
    if args.kind == "cnn":
        module = FarmCnn(args.shape, args.features)
    elif args.kind == "impala":
        module = FarmImpala(args.shape, args.features, args.channels)
    else:
        module = Mlp(args.shape, args.features)
    if args.init == "farm":
        farm_init(module)
    scripted = torch.jit.script(module)
    with torch.no_grad():  # the shapes the farm will check at start
        out = scripted(torch.zeros(2, *args.shape))
    assert out.shape == (2, args.features), out.shape
    scripted.save(args.out)
    params = sum(p.numel() for p in module.parameters())
    print(f"{args.out}: {args.kind} [B, {', '.join(map(str, args.shape))}] -> [B, {args.features}], {params} parameters")


if __name__ == "__main__":
    main()
