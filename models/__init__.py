"""The model zoo: models by name, orthogonality, consistent dropout.

    model = models.build("mlp", in_features=64, out_features=10, depth=8,
                         width=64, activation="tanh", orthogonal="bjorck")
"""

from models import orthogonal, retraction
from models.adapters.calling import ModelCall, call_model, declare_call
from models.adapters.recurrent import wrap_recurrent
from models.adapters.residual import ResidualView, residual_stack
from models.adapters.sequential import SequentialStack, layer_stack
from models.cnn import OrthoConvNet, OrthoLeNet
from models.convnet import ConvNet
from models.dropout import ConsistentDropout, frozen_masks
from models.errors import ModelConfigError
from models.language_model import RecurrentBlockLM, RecurrentLM
from models.mlp import MLP
from models.recurrent import GRU, LSTM, DiagonalLinearRNN, TanhRNN
from models.registry import available, build, register_model, takes_option
from models.residual_mlp import ResidualMLP
from models.resnet import ResNet
from models.transformer import GPT

register_model("mlp")(MLP)
register_model("residual_mlp")(ResidualMLP)
register_model("ortho_lenet")(OrthoLeNet)
register_model("ortho_convnet")(OrthoConvNet)
register_model("convnet")(ConvNet)
register_model("rnn_lm")(RecurrentLM)
register_model("rnn_block_lm")(RecurrentBlockLM)
register_model("resnet")(ResNet)
register_model("gpt")(GPT)

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
