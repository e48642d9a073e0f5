"""A user's ``nn.Sequential`` MLP or CNN seen as a layer stack (the structure of FOTON, PEPITA, FA, DFA).

    net = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 10))
    stack = models.layer_stack(net, orthogonal="bjorck")   # hidden layers orthogonal, for FOTON
    trainers.build_engine("foton").compute_grads(stack, x, y, loss_fn)

``layer_stack`` accepts ``[Flatten | Unflatten], A, [Dropout], act, A, [Dropout], act, ..., A``
where each linear map ``A`` is an ``nn.Conv2d`` or an ``nn.Linear`` (``Flatten``
right before a ``Linear`` that follows a convolution), with one element-wise
activation class throughout (``Tanh``, ``ReLU``, ``GELU``, ``Identity``,
``Sigmoid``, ``LeakyReLU``) and dropout, if any, before the activation (the
stack's ``h_l = act(drop(A_l h_{l-1} + b_l))``; after it, the engines' update
would not be the network's). A leading ``Flatten`` or ``Unflatten`` is the
stack's ``input_features`` (a 2-D input to a first ``Linear`` is used as is). It
wraps the user's module: the layers and their Parameters are the user's own
objects (training updates them in place), and the forward is the user's
``Sequential`` itself. Each ``nn.Dropout`` is replaced in place by a
``ConsistentDropout`` of the same rate (no parameters), so the engines' passes
can reuse its masks. Anything else is refused in one ``ModelConfigError`` line
naming the position.
"""

from torch import nn

from gradengines.models.errors import ModelConfigError
from gradengines.models.layers.dropout import ConsistentDropout
from gradengines.models.orthogonal import DEFAULT_BJORCK_ITERS, make_orthogonal

__all__ = ["SequentialStack", "layer_stack"]

ACTIVATIONS = (nn.Tanh, nn.ReLU, nn.GELU, nn.Identity, nn.Sigmoid, nn.LeakyReLU)


class FlattenedLinear(nn.Module):
    """``linear(x.flatten(1))``: a user's ``Flatten, Linear`` pair as one layer of the stack (``.linear`` is the
    user's module, the engines' closed forms apply; not registered in the stack, so its Parameters keep their
    names once)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return self.linear(x.flatten(1))


class SequentialStack(nn.Module):
    """The layer-stack view of an ``nn.Sequential`` (module docstring); ``forward`` is the Sequential's."""

    layers: list[nn.Module]
    dropouts: list[nn.Module]
    act: nn.Module
    _reshape: nn.Module | None

    def __init__(self, sequential: nn.Sequential):
        super().__init__()
        self.sequential = sequential  # the only registered child: Parameters keep their names and objects
        linears: list[nn.Module] = []
        dropouts: list[nn.Module] = []
        acts: list[nn.Module] = []
        items = list(sequential.named_children())
        reshape = bool(items) and isinstance(items[0][1], (nn.Flatten, nn.Unflatten))
        self.__dict__["_reshape"] = items[0][1] if reshape else None
        position = int(reshape)
        while position < len(items):
            name, module = items[position]
            if isinstance(module, (nn.Dropout, ConsistentDropout)) and acts:
                raise ModelConfigError(f"layer_stack: sequential[{name}] is a dropout after the activation; put it "
                                       "before (h = act(drop(W h + b))), the order the engines' updates follow")
            flatten = isinstance(module, nn.Flatten) and bool(linears) and position + 1 < len(items)
            if flatten:
                position += 1
                name, module = items[position]
            if not isinstance(module, (nn.Linear, nn.Conv2d)) or (flatten and not isinstance(module, nn.Linear)):
                raise ModelConfigError(f"layer_stack: sequential[{name}] is a {type(module).__name__} where an "
                                       "nn.Linear or nn.Conv2d is expected (the stack is Linear or Conv2d, [Dropout], "
                                       "activation, ..., [Flatten], Linear)")
            previous = linears[-1] if linears else None
            if isinstance(module, nn.Linear) and not flatten and isinstance(previous, nn.Conv2d):
                raise ModelConfigError(f"layer_stack: sequential[{name}] is an nn.Linear right after a convolution "
                                       f"(and its activation); put an nn.Flatten before it, so that the "
                                       f"convolution's (B, C, H, W) output becomes its (B, C*H*W) input")
            if isinstance(module, nn.Conv2d) and previous is not None and not isinstance(previous, nn.Conv2d):
                raise ModelConfigError(f"layer_stack: sequential[{name}] is an nn.Conv2d after a Linear layer; the "
                                       f"stack's convolutions come first (Conv2d, ..., Flatten, Linear, ...)")
            if isinstance(module, nn.Conv2d) and module.padding_mode != "zeros":
                raise ModelConfigError(f"layer_stack: sequential[{name}] pads with '{module.padding_mode}'; the "
                                       "engines' transposed convolutions assume zero padding")
            linears.append(FlattenedLinear(module) if flatten and isinstance(module, nn.Linear) else module)
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
        if linears and isinstance(linears[-1], nn.Conv2d):
            raise ModelConfigError("layer_stack: the last layer is an nn.Conv2d; end with [Flatten], Linear (the "
                                   "output y = W h + b of the classes)")
        self.__dict__["layers"] = linears  # plain lists: the modules stay registered once, under `sequential`
        self.__dict__["dropouts"] = dropouts
        self.__dict__["act"] = acts[0] if acts else nn.Identity()

    def input_features(self, x):
        """h_0: the input through a leading ``Flatten`` / ``Unflatten``; flattened to (B, d_0) before a first
        ``Linear``, as is before a first ``Conv2d``."""
        if self._reshape is not None:
            return self._reshape(x)
        return x if isinstance(self.layers[0], nn.Conv2d) else x.flatten(1)

    def forward(self, x):
        return self.sequential(x)


def layer_stack(sequential: nn.Sequential, *, orthogonal: str | None = None,
                iters: int = DEFAULT_BJORCK_ITERS) -> SequentialStack:
    """The layer-stack view of ``sequential``; ``orthogonal`` (``bjorck``, ``polar``, ``expm``,
    ``cayley``) makes its hidden layers orthogonal in place (``models.orthogonal.make_orthogonal``),
    as FOTON needs."""
    if not isinstance(sequential, nn.Sequential):
        raise ModelConfigError(f"layer_stack needs an nn.Sequential, got {type(sequential).__name__}")
    stack = SequentialStack(sequential)
    if orthogonal is not None and any(isinstance(layer, nn.Conv2d) for layer in stack.layers):
        raise ModelConfigError("layer_stack: orthogonal= makes nn.Linear layers orthogonal, not convolutions; for "
                               "orthogonal convolutions use the zoo's ortho_lenet / ortho_convnet")
    for layer in stack.layers[:-1]:
        make_orthogonal(getattr(layer, "linear", layer), orthogonal, iters=iters)
    return stack
