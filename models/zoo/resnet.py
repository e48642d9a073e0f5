"""ResNets whose residual stream keeps one shape (Highway-BP paper, App. G, Eq. 14-15).

A standard ResNet downsamples inside its residual connections (strided convolutions,
projection shortcuts), whose Jacobians are neither cheap nor diagonal. Here the stream
stays (B, w, H, W) from the stem to the head, and every block is wrapped in an
invertible downsampling of its stage (s = 1, 2, 4):

    Down_s: (B, C, H, W) -> (B, C s, H/s, W/s)   split into s x s cells, average each
            cell over its s rows, stack its s columns as channels (so channels grow x s,
            16 -> 32 -> 64, as in the standard ResNet);
    Up_s:   the right inverse, Down_s(Up_s(y)) = y  (each value copied to the s rows).

    g_i(h) = Up_s(Block_i(Down_s(h)))
    preact: h_i = h_{i-1} + g_i(h_{i-1}),        Block = BN-ReLU-conv-BN-ReLU-conv,  K_i = I
    post:   h_i = ReLU(h_{i-1} + g_i(h_{i-1})),  Block = conv-BN-ReLU-conv-BN,       K_i = 1[h + z > 0]

Stem: a 3x3 conv to w channels (post: then BN and ReLU). Head: Down_4, (preact: BN,
ReLU), global average pooling, linear. ``depth`` = 6n + 2 counts the layers as He et
al. (n blocks per stage: 20, 32, 56, 110 ...). Inputs: flat (B, C*H*W) or (B, C, H, W)
images with H and W divisible by 4 (``in_shape``, else inferred: 64 -> 1x8x8 digits,
3072 -> 3x32x32 CIFAR-10). Residual-stack protocol: ``stem``, ``blocks``, ``head``.
"""

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from gradengines.models.errors import ModelConfigError, positive_int
from gradengines.models.zoo.cnn import infer_image_shape

__all__ = ["ResNet", "downsample", "upsample"]

STAGE_SCALES = (1, 2, 4)


def downsample(x: torch.Tensor, s: int) -> torch.Tensor:
    """Down_s (module docstring): (B, C, H, W) -> (B, C s, H/s, W/s)."""
    if s == 1:
        return x
    B, C, H, W = x.shape
    cells = x.reshape(B, C, H // s, s, W // s, s).mean(dim=3)  # (B, C, H/s, W/s, s): rows averaged
    return cells.permute(0, 1, 4, 2, 3).reshape(B, C * s, H // s, W // s)


def upsample(y: torch.Tensor, s: int) -> torch.Tensor:
    """Up_s, the right inverse of ``downsample``: (B, C s, H/s, W/s) -> (B, C, H, W)."""
    if s == 1:
        return y
    B, Cs, h, w = y.shape
    cells = y.reshape(B, Cs // s, s, h, w).permute(0, 1, 3, 4, 2)  # (B, C, h, w, s)
    return cells.unsqueeze(3).expand(B, Cs // s, h, s, w, s).reshape(B, Cs // s, h * s, w * s)


def _conv(c):
    return nn.Conv2d(c, c, 3, padding=1, bias=False)


class ResNetBlock(nn.Module):
    """g(h) = Up_s(Block(Down_s(h))) and its combine (module docstring)."""

    def __init__(self, channels: int, scale: int, preact: bool):
        super().__init__()
        c = channels * scale
        self.scale, self.preact = scale, preact
        if preact:
            self.body = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), _conv(c), nn.BatchNorm2d(c), nn.ReLU(), _conv(c))
        else:
            self.body = nn.Sequential(_conv(c), nn.BatchNorm2d(c), nn.ReLU(), _conv(c), nn.BatchNorm2d(c))

    def branch(self, h):
        return upsample(self.body(downsample(h, self.scale)), self.scale)

    def combine(self, h, z):
        """h + z (preact, K = I) or ReLU(h + z) (post, K = diag 1[h + z > 0])."""
        return h + z if self.preact else F.relu(h + z)

    def forward(self, h):
        return self.combine(h, self.branch(h))


class ResNet(nn.Module):
    """CIFAR-style ResNet (depth 6n + 2) with a constant-shape residual stream (module docstring)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        depth: int = 20,
        width: int = 16,
        variant: str = "preact",
        in_shape: Sequence[int] | None = None,
    ):
        super().__init__()
        for name, value in (("out_features", out_features), ("width", width), ("depth", depth)):
            positive_int(name, value)
        if depth < 8 or (depth - 2) % 6:
            raise ModelConfigError(f"resnet depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, 56, 110), got {depth}")
        if variant not in ("preact", "post"):
            raise ModelConfigError(f"resnet variant must be preact or post, got {variant!r}")
        self.in_shape = infer_image_shape(in_features, in_shape)
        C, H, W = self.in_shape
        if H % 4 or W % 4:
            raise ModelConfigError(f"resnet needs image sides divisible by 4 (stages downsample by 2 and 4), "
                                   f"got {H}x{W}")
        preact = variant == "preact"
        n = (depth - 2) // 6
        self.stem_conv = nn.Conv2d(C, width, 3, padding=1, bias=False)
        self.stem_post = nn.Identity() if preact else nn.Sequential(nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.ModuleList(ResNetBlock(width, s, preact) for s in STAGE_SCALES for _ in range(n))
        last = width * STAGE_SCALES[-1]
        self.head_pre = nn.Sequential(nn.BatchNorm2d(last), nn.ReLU()) if preact else nn.Identity()
        self.fc = nn.Linear(last, out_features)

    def stem(self, x):
        """(B, C*H*W) or (B, C, H, W) -> the stream (B, width, H, W)."""
        return self.stem_post(self.stem_conv(x.reshape(x.shape[0], *self.in_shape)))

    def head(self, h):
        """Down_4, (BN, ReLU), global average pool, linear: (B, width, H, W) -> (B, out)."""
        return self.fc(self.head_pre(downsample(h, STAGE_SCALES[-1])).mean(dim=(2, 3)))

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)
