"""s3r_torch: s3r's int8 linear layer (S3R, S3R-EC) as a PyTorch module, for people who train in
PyTorch on CPUs.

    import torch, s3r_torch
    layer = s3r_torch.Linear(1024, 4096, bias=False, recipe="s3r+dx", seed=0)
    model = s3r_torch.convert(model, recipe="s3r+dx")   # every nn.Linear but the LM head
    opt = torch.optim.AdamW(model.parameters())
    s3r_torch.advance_on(opt)                            # a new threshold key after every opt.step()

The forward and backward passes are s3r's QuantLinear (docs/SPEC.md sections 1-4): int8 products
with per-token x per-channel scales (round to nearest even), the upstream gradient quantized once
per layer with the recipe's rounding, and S3R-EC's correction; bit for bit the numbers of s3r's
own layer for the same inputs, key and layer index, for any thread count (PyTorch's
torch.get_num_threads()).

Threshold keys (SPEC section 3): the backward pass of the layer with index `layer_index` at step
`step` draws its thresholds from fold_in(fold_in(key(seed), step), layer_index), and token t of
the step has the global index t (the tokens of every forward call of a layer since the step began,
in call order: gradient accumulation over micro-batches keeps the micro-batches' thresholds
apart, as `s3r train --micro-batch` does). `step` is one counter for the process: step()
advances it (or advance_on(optimizer) after each optimizer step); convert() numbers the layers
0, 1, 2, ... in the model's module order. A run is reproducible bit for bit from its seed.
"""
import torch
from torch import nn

from . import _C

__all__ = ["Linear", "convert", "recipes", "step", "current_step", "set_step", "advance_on", "layer_key",
           "machine", "release_buffers"]

_step = 0
_WORKSPACE = _C.Workspace()  # the backward passes' scratch, shared by every layer
_begun = 0  # how many times a step has begun (step(), set_step()): the layers' token counts restart


def recipes():
    """{name: what it is} of the recipes a layer takes (s3r's named recipes, paper order)."""
    return dict(_C.recipes())


def machine():
    """s3r's machine line: the CPU, the kernel tier and GEMM backends s3r chose on it (S3R_ISA and
    S3R_MAX_ISA, read when the package loads, pick lesser ones), the threads."""
    return _C.machine()


def release_buffers():
    """Frees the buffers that wait for reuse. The layers' outputs of 1 MiB or more (y, and the
    gradients of the input and the weight) come from a pool that keeps freed ones (up to 2 GiB)
    for the next call of the same size, and the int8 codes a forward call saves for its backward
    are reused likewise: a fresh 32 MB tensor costs 8192 page faults on first touch. This returns
    that memory to the system, as torch.cuda.empty_cache() does on GPUs."""
    _C.release_buffers()


def current_step():
    """The step counter of the threshold keys (starts at 0)."""
    return _step


def set_step(value):
    """Begins step `value` (for a resumed run: the number of optimizer steps taken): the next
    forward call of each layer is its first of the step (token 0), even when the value is unchanged."""
    global _step, _begun
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2 ** 32:
        raise ValueError(f"s3r_torch.set_step: the step must be an int in [0, 2^32), got {value!r}")
    _step, _begun = value, _begun + 1


def step():
    """Advances the step counter: the next backward passes draw new thresholds."""
    set_step(_step + 1)


def advance_on(optimizer):
    """Makes optimizer.step() advance the step counter after each call; returns the optimizer."""
    if getattr(optimizer, "_s3r_torch_advances", False):
        return optimizer
    inner = optimizer.step

    def step_and_advance(*args, **kwargs):
        out = inner(*args, **kwargs)
        step()
        return out

    optimizer.step = step_and_advance
    optimizer._s3r_torch_advances = True
    return optimizer


def layer_key(seed, step_index, layer_index):
    """(k0, k1): the threshold key of layer `layer_index` at step `step_index` (SPEC section 3)."""
    return _C.layer_key(seed, step_index, layer_index)


def _check_u32(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2 ** 32:
        raise ValueError(f"s3r_torch: {name} must be an int in [0, 2^32), got {value!r}")


class _LinearFunction(torch.autograd.Function):
    """y = x W^T through s3r; the backward pass of one call uses the key and token offset fixed
    at its forward."""

    @staticmethod
    def forward(ctx, x2d, weight, layer, tokens_per_example, first_token, step_index):
        y, saved = _C.forward(x2d, weight, layer.recipe, tokens_per_example, True)
        ctx.saved = saved
        ctx.layer = layer
        ctx.place = (step_index, first_token)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.saved is None:
            raise RuntimeError("s3r_torch.Linear: a second backward pass through the same forward call "
                               "(retain_graph=True) is not supported: its int8 codes were freed by the first")
        layer = ctx.layer
        step_index, first_token = ctx.place
        dx, dw = _C.backward(ctx.saved, grad_out.contiguous(), ctx.needs_input_grad[0], layer.seed, step_index,
                             layer.layer_index, first_token, _WORKSPACE)
        ctx.saved = None  # its buffers went back for reuse (retain_graph is not supported)
        return dx, dw, None, None, None, None


class Linear(nn.Module):
    """A drop-in nn.Linear (weight (out_features, in_features), optional bias, both float32) whose
    products are s3r's: int8 in the int8 recipes (the default "s3r+dx"), bf16 or f32 otherwise.
    Inputs of any leading shape (..., in_features), float32 (under torch.autocast also bfloat16,
    widened to float32 first); the output is float32. The tokens of one example are the
    second-last dimension (S of (B, S, K)), or all rows of a 2-D input. `layer_index` and `seed`
    pick the thresholds (see the package's doc); convert() sets them."""

    def __init__(self, in_features, out_features, bias=True, recipe="s3r+dx", seed=0, layer_index=0,
                 device=None, dtype=None):
        super().__init__()
        if dtype not in (None, torch.float32):
            raise TypeError(f"s3r_torch.Linear: parameters are float32, got dtype {dtype}")
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"s3r_torch.Linear: s3r runs on the CPU only, got device {device}")
        _check_u32("seed", seed)
        _check_u32("layer_index", layer_index)
        self.in_features, self.out_features = int(in_features), int(out_features)
        if self.in_features < 1 or self.out_features < 1:
            raise ValueError(f"s3r_torch.Linear: features must be >= 1, got ({in_features}, {out_features})")
        self.recipe = _C.canonical_recipe(recipe)
        self.seed, self.layer_index = seed, layer_index
        self.weight = nn.Parameter(torch.empty(self.out_features, self.in_features))
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_features))
        else:
            self.register_parameter("bias", None)
        self._tokens = (-1, 0)  # (_begun when counted, tokens of this step's forward calls with gradients)
        self.reset_parameters()

    def reset_parameters(self):
        nn.Linear.reset_parameters(self)  # nn.Linear's initialization

    @classmethod
    def from_linear(cls, linear, recipe="s3r+dx", seed=0, layer_index=0):
        """An s3r layer holding `linear`'s parameters (the same Parameter objects: optimizers that
        already hold them keep working)."""
        layer = cls(linear.in_features, linear.out_features, bias=False, recipe=recipe, seed=seed,
                    layer_index=layer_index)
        layer.weight = linear.weight
        layer.bias = linear.bias
        return layer

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe={self.recipe}, seed={self.seed}, layer_index={self.layer_index}")

    def forward(self, x):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"s3r_torch.Linear: the input must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"s3r_torch.Linear: the input has shape {tuple(x.shape)}, expected (..., "
                             f"{self.in_features}) (in_features)")
        if x.device.type != "cpu":
            raise ValueError(f"s3r_torch.Linear: the input is on {x.device}; s3r runs on the CPU only")
        if x.dtype in (torch.bfloat16, torch.float16) and torch.is_autocast_cpu_enabled():
            x = x.float()  # under autocast, as autocast's float32 operations: s3r quantizes from f32
        if x.dtype != torch.float32:
            raise TypeError(f"s3r_torch.Linear: the input has dtype {x.dtype}, expected torch.float32 "
                            "(bfloat16 only under torch.autocast)")
        lead = x.shape[:-1]
        x2d = x.reshape(-1, self.in_features)
        if not x2d.is_contiguous():
            x2d = x2d.contiguous()
        tokens = x2d.shape[0]
        per_example = x.shape[-2] if x.dim() >= 3 else max(tokens, 1)
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            step_index = _step
            seen = self._tokens[1] if self._tokens[0] == _begun else 0
            self._tokens = (_begun, seen + tokens)
            y = _LinearFunction.apply(x2d, self.weight, self, per_example, seen, step_index)
        else:
            y, _ = _C.forward(x2d, self.weight, self.recipe, per_example, False)
        y = y.view(*lead, self.out_features)
        return y if self.bias is None else y + self.bias


def convert(model, recipe="s3r+dx", skip=None, seed=0):
    """Replaces every nn.Linear of `model` (in place; returns it) by an s3r_torch.Linear holding
    the same parameters, numbered in module order (the threshold keys' layer index): 0, 1, 2, ...,
    or after the largest index of the model's s3r layers when it already has some.
    skip: names (or name suffixes) of modules to keep as they are; by default the LM head (a
    module named lm_head, output or head), which the paper keeps in bf16: pass skip=[] to convert
    it too."""
    canonical = _C.canonical_recipe(recipe)
    _check_u32("seed", seed)
    skip = ["lm_head", "output", "head"] if skip is None else list(skip)
    if any(not isinstance(s, str) for s in skip):
        raise TypeError("s3r_torch.convert: skip must be a list of module names")
    index = 1 + max((m.layer_index for m in model.modules() if isinstance(m, Linear)), default=-1)
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or isinstance(module, Linear):
            continue
        if any(name == s or name.endswith("." + s) for s in skip):
            continue
        if module.weight.dtype != torch.float32 or module.weight.device.type != "cpu":
            raise TypeError(f"s3r_torch.convert: {name}'s weight is {module.weight.dtype} on "
                            f"{module.weight.device}; s3r layers hold float32 parameters on the CPU")
        parent = model
        *path, last = name.split(".")
        for p in path:
            parent = getattr(parent, p)
        setattr(parent, last, Linear.from_linear(module, canonical, seed, index))
        index += 1
    return model
