"""A user's ``nn.Sequential`` MLP seen as a layer stack (the structure of FOTON, PEPITA, FA, DFA).

    net = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 10))
    stack = models.layer_stack(net, orthogonal="bjorck")   # hidden layers orthogonal, for FOTON
    trainers.build_engine("foton").compute_grads(stack, x, y, loss_fn)

``layer_stack`` accepts ``[Flatten], Linear, [Dropout], act, Linear, [Dropout], act, ..., Linear``
with one element-wise activation class throughout (``Tanh``, ``ReLU``, ``GELU``,
``Identity``, ``Sigmoid``, ``LeakyReLU``) and dropout, if any, before the
activation (the stack's ``h_l = act(drop(A_l h_{l-1} + b_l))``; after it, the
engines' update would not be the network's). It wraps the user's module: the
``Linear`` layers and their Parameters are the user's own objects (training
updates them in place), and the forward is the user's ``Sequential`` itself.
Each ``nn.Dropout`` is replaced in place by a ``ConsistentDropout`` of the same
rate (no parameters), so the engines' passes can reuse its masks. Anything else
is refused in one ``ModelConfigError`` line naming the position.
"""

from torch import nn

from models.dropout import ConsistentDropout
from models.errors import ModelConfigError
from models.orthogonal import make_orthogonal

__all__ = ["SequentialStack", "layer_stack"]

ACTIVATIONS = (nn.Tanh, nn.ReLU, nn.GELU, nn.Identity, nn.Sigmoid, nn.LeakyReLU)


class SequentialStack(nn.Module):
    """The layer-stack view of an ``nn.Sequential`` (module docstring); ``forward`` is the Sequential's."""

    def __init__(self, sequential: nn.Sequential):
        super().__init__()
        self.sequential = sequential  # the only registered child: Parameters keep their names and objects
        linears, dropouts, acts = [], [], []
        items = list(sequential.named_children())
        flatten = bool(items) and isinstance(items[0][1], nn.Flatten)
        position = int(flatten)
        while position < len(items):
            name, module = items[position]
            if isinstance(module, (nn.Dropout, ConsistentDropout)) and acts:
                raise ModelConfigError(f"layer_stack: sequential[{name}] is a dropout after the activation; put it "
                                       "before (h = act(drop(W h + b))), the order the engines' updates follow")
            if not isinstance(module, nn.Linear):
                raise ModelConfigError(f"layer_stack: sequential[{name}] is a {type(module).__name__} where an "
                                       "nn.Linear is expected (the stack is Linear, [Dropout], activation, ..., "
                                       "Linear)")
            linears.append(module)
            position += 1
            if position == len(items):
                break
            name, module = items[position]
            rate = 0.0
            if isinstance(module, (nn.Dropout, ConsistentDropout)):
                rate = module.p
                sequential._modules[name] = module = ConsistentDropout(rate)
                dropouts.append(module)
                position += 1
            else:
                dropouts.append(ConsistentDropout(0.0))
            if position == len(items) or not isinstance(items[position][1], ACTIVATIONS):
                what = type(items[position][1]).__name__ if position < len(items) else "the end"
                raise ModelConfigError(f"layer_stack: an element-wise activation must follow Linear "
                                       f"sequential[{items[position - 1][0]}] (and its dropout), found {what}")
            acts.append(items[position][1])
            position += 1
        kinds = {type(a) for a in acts}
        if len(kinds) > 1:
            raise ModelConfigError(f"layer_stack: one activation class throughout, found "
                                   f"{', '.join(sorted(k.__name__ for k in kinds))}")
        if not linears:
            raise ModelConfigError("layer_stack: the Sequential holds no nn.Linear layer")
        self.__dict__["layers"] = linears  # plain lists: the modules stay registered once, under `sequential`
        self.__dict__["dropouts"] = dropouts
        self.__dict__["act"] = acts[0] if acts else nn.Identity()

    @staticmethod
    def input_features(x):
        """h_0: the input flattened to (B, d_0), as a leading ``nn.Flatten`` (or a 2-D input) has it."""
        return x.flatten(1)

    def forward(self, x):
        return self.sequential(x)


def layer_stack(sequential: nn.Sequential, *, orthogonal: str | None = None, iters: int = 3) -> SequentialStack:
    """The layer-stack view of ``sequential``; ``orthogonal`` (``bjorck``, ``polar``, ``expm``,
    ``cayley``) makes its hidden layers orthogonal in place (``models.orthogonal.make_orthogonal``),
    as FOTON needs."""
    if not isinstance(sequential, nn.Sequential):
        raise ModelConfigError(f"layer_stack needs an nn.Sequential, got {type(sequential).__name__}")
    stack = SequentialStack(sequential)
    for layer in stack.layers[:-1]:
        make_orthogonal(layer, orthogonal, iters=iters)
    return stack
