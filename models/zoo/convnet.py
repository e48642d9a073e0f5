"""A plain CNN as a layer stack (``convnet``): the convolutional network feedback alignment is
usually run on (BioTorch's setting), for FA, DFA, PEPITA and backprop.

    h_0 = x as an image (B, C, H, W)
    h_l = act(drop(conv_l(h_{l-1})))     l = 1 .. depth: 3x3 (``kernel_size``) zero-padded
                                         convolutions to ``channels`` channels, stride 1 for
                                         the first and 2 for the others
    y   = W flatten(h_depth) + b

digits (1, 8, 8): (16, 8, 8) -> (16, 4, 4) -> 10. It is ``models.layer_stack`` of that
``nn.Sequential`` (``trainers.core.protocols.LayerStack``), so its parameters are named
``sequential.<i>.weight``; inputs, flat or shaped, are read as the image. Not
orthogonal: FOTON refuses it (``ortho_lenet`` and ``ortho_convnet`` are the
zoo's orthogonal CNNs).
"""

from collections.abc import Sequence

from torch import nn

from gradengines.models.adapters.sequential import SequentialStack
from gradengines.models.errors import ModelConfigError, positive_int
from gradengines.models.layers.activations import build_activation
from gradengines.models.layers.dropout import ConsistentDropout
from gradengines.models.zoo.cnn import infer_image_shape

__all__ = ["ConvNet"]


class ConvNet(SequentialStack):
    """Plain CNN layer stack (module docstring)."""

    def __init__(self, in_features: int, out_features: int, *, in_shape: Sequence[int] | None = None,
                 depth: int = 2, channels: int = 16, kernel_size: int = 3, activation: str = "tanh",
                 dropout: float = 0.0, bias: bool = True):
        positive_int("out_features", out_features)
        positive_int("depth", depth)
        positive_int("channels", channels)
        positive_int("kernel_size", kernel_size)
        if kernel_size % 2 == 0:
            raise ModelConfigError(f"kernel_size must be odd (same padding), got {kernel_size}")
        if not 0 <= dropout < 1:
            raise ModelConfigError(f"dropout must be in [0, 1), got {dropout}")
        shape = infer_image_shape(in_features, in_shape)
        layers: list[nn.Module] = []
        c, h, w = shape
        for i in range(depth):
            stride = 1 if i == 0 else 2
            layers += [nn.Conv2d(c, channels, kernel_size, stride=stride, padding=kernel_size // 2, bias=bias),
                       ConsistentDropout(dropout), build_activation(activation)]
            c, h, w = channels, (h - 1) // stride + 1, (w - 1) // stride + 1
        layers += [nn.Flatten(), nn.Linear(c * h * w, out_features, bias=bias)]
        super().__init__(nn.Sequential(*layers))
        self.in_shape = shape

    def input_features(self, x):
        """h_0: (B, features) or (B, C, H, W) -> (B, C, H, W)."""
        return x.reshape(x.shape[0], *self.in_shape)

    def forward(self, x):
        return self.sequential(self.input_features(x))
