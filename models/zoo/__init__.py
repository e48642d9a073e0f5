"""The zoo's architectures, registered by name (``models.build(name, ...)``): MLPs, residual MLPs, CNNs with
orthogonal convolutions, ResNets, a GPT and recurrent language models."""

from gradengines.models.registry import register_model
from gradengines.models.zoo.cnn import OrthoConvNet, OrthoLeNet
from gradengines.models.zoo.convnet import ConvNet
from gradengines.models.zoo.language_model import RecurrentBlockLM, RecurrentLM
from gradengines.models.zoo.mlp import MLP
from gradengines.models.zoo.residual_mlp import ResidualMLP
from gradengines.models.zoo.resnet import ResNet
from gradengines.models.zoo.transformer import GPT

register_model("mlp")(MLP)
register_model("residual_mlp")(ResidualMLP)
register_model("ortho_lenet")(OrthoLeNet)
register_model("ortho_convnet")(OrthoConvNet)
register_model("convnet")(ConvNet)
register_model("rnn_lm")(RecurrentLM)
register_model("rnn_block_lm")(RecurrentBlockLM)
register_model("resnet")(ResNet)
register_model("gpt")(GPT)

__all__ = ["MLP", "ResidualMLP", "OrthoLeNet", "OrthoConvNet", "ConvNet", "RecurrentLM", "RecurrentBlockLM", "ResNet",
           "GPT"]
