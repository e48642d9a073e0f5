"""The model zoo: models by name, orthogonality, consistent dropout.

By concern: ``models.zoo`` (the architectures, by name), ``models.orthogonal`` (parametrizations, Björck and
polar projections, the Cayley retraction, orthogonal convolutions), ``models.layers`` (recurrent cells, dropout,
scans, activations), ``models.adapters`` (users' models seen as stacks, and how they are called).

    model = models.build("mlp", in_features=64, out_features=10, depth=8,
                         width=64, activation="tanh", orthogonal="bjorck")
"""

from gradengines.models import layers, orthogonal, zoo
from gradengines.models.adapters.calling import ModelCall, call_model, declare_call
from gradengines.models.adapters.recurrent import wrap_recurrent
from gradengines.models.adapters.residual import ResidualView, residual_stack
from gradengines.models.adapters.sequential import SequentialStack, layer_stack
from gradengines.models.errors import ModelConfigError
from gradengines.models.layers.dropout import ConsistentDropout, frozen_masks
from gradengines.models.layers.recurrent import GRU, LSTM, DiagonalLinearRNN, TanhRNN
from gradengines.models.orthogonal import retraction
from gradengines.models.registry import available, build, register_model, takes_option
from gradengines.models.zoo import (
    GPT,
    MLP,
    ConvNet,
    OrthoConvNet,
    OrthoLeNet,
    RecurrentBlockLM,
    RecurrentLM,
    ResidualMLP,
    ResNet,
)

__all__ = [
    "MLP",
    "ResidualMLP",
    "OrthoLeNet",
    "OrthoConvNet",
    "ConvNet",
    "RecurrentLM",
    "RecurrentBlockLM",
    "ResNet",
    "GPT",
    "TanhRNN",
    "GRU",
    "LSTM",
    "DiagonalLinearRNN",
    "ConsistentDropout",
    "ModelConfigError",
    "available",
    "build",
    "frozen_masks",
    "orthogonal",
    "retraction",
    "layers",
    "zoo",
    "register_model",
    "takes_option",
    "layer_stack",
    "SequentialStack",
    "wrap_recurrent",
    "residual_stack",
    "ResidualView",
    "ModelCall",
    "call_model",
    "declare_call",
]
