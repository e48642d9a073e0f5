"""The model zoo: models by name, orthogonality, consistent dropout.

By concern: ``models.zoo`` (the architectures, by name), ``models.orthogonal`` (parametrizations, Björck and
polar projections, the Cayley retraction, orthogonal convolutions), ``models.layers`` (recurrent cells, dropout,
scans, activations), ``models.adapters`` (users' models seen as stacks, and how they are called).

    model = models.build("mlp", in_features=64, out_features=10, depth=8,
                         width=64, activation="tanh", orthogonal="bjorck")
"""

from models import layers, orthogonal, zoo
from models.adapters.calling import ModelCall, call_model, declare_call
from models.adapters.recurrent import wrap_recurrent
from models.adapters.residual import ResidualView, residual_stack
from models.adapters.sequential import SequentialStack, layer_stack
from models.errors import ModelConfigError
from models.layers.dropout import ConsistentDropout, frozen_masks
from models.layers.recurrent import GRU, LSTM, DiagonalLinearRNN, TanhRNN
from models.orthogonal import retraction
from models.registry import available, build, register_model, takes_option
from models.zoo import GPT, MLP, ConvNet, OrthoConvNet, OrthoLeNet, RecurrentBlockLM, RecurrentLM, ResidualMLP, ResNet

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
