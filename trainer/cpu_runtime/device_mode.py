"""The TorchFunctionMode that makes Megatron Core's CUDA-only tensor code run on CPU.

Megatron Core hard-codes CUDA in ~485 places, e.g. `torch.zeros([], ..., device="cuda")` in
`pipeline_parallel/schedules.py:749` and `torch.empty(..., device=torch.cuda.current_device())`
in `pipeline_parallel/p2p_communication.py:211-223`. Rather than patching each call site, one
mode sees every torch call (factories included) and rewrites its CUDA device arguments to CPU.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.graph import get_gradient_edge
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")

# Tensor methods that only move or pin memory; on CPU the tensor is already where it must be.
_IDENTITY_METHODS = frozenset({torch.Tensor.cuda, torch.Tensor.pin_memory})

# torch 2.13 sends these through __torch_function__, and a mode is switched off while its own
# handler runs, so the whole backward pass would otherwise run without the redirection (the
# SP backward then allocates on CUDA at `tensor_parallel/layers.py:646`).
_BACKWARD_ENTRY_POINTS = frozenset(
    {torch.autograd.backward, torch.autograd.grad, torch.Tensor.backward}
)


def names_cuda_device(value: object) -> bool:
    """Whether a device argument asks for CUDA; a bare int is a CUDA ordinal from
    `torch.cuda.current_device()`."""
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, str):
        return value.startswith("cuda")
    return isinstance(value, int) and not isinstance(value, bool)


def redirect_device_arguments(
    func: Callable[..., Any], args: tuple, kwargs: dict
) -> tuple[tuple, dict]:
    """Rewrites CUDA `device=` keywords (and `Tensor.to`'s positional device) to CPU, and drops
    `pin_memory=True`, which needs a CUDA driver."""
    if kwargs:
        if "device" in kwargs and names_cuda_device(kwargs["device"]):
            kwargs = {**kwargs, "device": _CPU}
        if kwargs.get("pin_memory"):
            kwargs = {**kwargs, "pin_memory": False}
    # Factories take the device as a keyword only; `Tensor.to` is the one common positional form.
    if func is torch.Tensor.to and len(args) > 1 and names_cuda_device(args[1]):
        args = (args[0], _CPU, *args[2:])
    return args, kwargs


def tensor_type_with_cuda_names(args: tuple, kwargs: dict) -> Any:
    """`Tensor.type()`: the query form reports CPU tensors under their CUDA type name, because
    Megatron asserts on that string (`optimizer/clip_grads.py:174`, `distrib_optimizer.py:466`,
    `optimizer.py:1028`); the conversion form gets CUDA type names mapped back to CPU ones."""
    target = args[1] if len(args) > 1 else kwargs.get("dtype")
    if target is None:
        name = torch.Tensor.type(args[0])
        if name.startswith("torch.") and not name.startswith("torch.cuda."):
            return "torch.cuda." + name.removeprefix("torch.")
        return name
    if isinstance(target, str) and target.startswith("torch.cuda."):
        target = "torch." + target.removeprefix("torch.cuda.")
    rest = {key: value for key, value in kwargs.items() if key != "dtype"}
    return torch.Tensor.type(args[0], target, **rest)


def _as_gradient_edges(value: Any) -> Any:
    """The same graph positions as GradientEdges, which are not tensors and so do not send the
    call through __torch_function__ again."""
    if isinstance(value, torch.Tensor):
        return get_gradient_edge(value)
    if isinstance(value, (list, tuple)):
        return tuple(get_gradient_edge(v) if isinstance(v, torch.Tensor) else v for v in value)
    return value


def _still_has_tensors(value: Any) -> bool:
    if isinstance(value, dict):
        return bool(value)
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, torch.Tensor) for v in value)
    return isinstance(value, torch.Tensor)


def call_backward_in_mode(
    mode: TorchFunctionMode, func: Callable[..., Any], args: tuple, kwargs: dict
) -> Any:
    """Runs backward/grad with `mode` back on the stack.

    Simply calling `func` under `with mode:` would dispatch to the mode again (endlessly). Given
    GradientEdges instead of tensors, torch finds no tensor argument and runs the autograd
    engine directly, and the engine keeps the mode stack it was called under.
    """
    arguments = inspect.signature(func).bind(*args, **kwargs).arguments
    if func is torch.Tensor.backward:
        func = torch.autograd.backward
        arguments["tensors"] = arguments.pop("self")
        arguments["grad_tensors"] = arguments.pop("gradient", None)
    roots = "outputs" if func is torch.autograd.grad else "tensors"
    arguments[roots] = _as_gradient_edges(arguments[roots])
    # grad() refuses GradientEdge inputs with materialize_grads.
    if "inputs" in arguments and not arguments.get("materialize_grads", False):
        arguments["inputs"] = _as_gradient_edges(arguments["inputs"])
    if _still_has_tensors(arguments[roots]) or _still_has_tensors(arguments.get("inputs")):
        return func(**arguments)  # rare forms (dict inputs): run as torch would, without the mode
    with mode:
        return func(**arguments)


class CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA requests to CPU for every torch call made while it is on the mode stack.

    Each behaviour can be switched off on its own, so a self-test can show what it is for.
    """

    def __init__(
        self, *, redirect_devices: bool, cuda_type_names: bool, backward_in_mode: bool
    ) -> None:
        super().__init__()
        self.redirect_devices = redirect_devices
        self.cuda_type_names = cuda_type_names
        self.backward_in_mode = backward_in_mode

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.backward_in_mode and func in _BACKWARD_ENTRY_POINTS:
            return call_backward_in_mode(self, func, args, kwargs)
        if self.cuda_type_names and func is torch.Tensor.type:
            return tensor_type_with_cuda_names(args, kwargs)
        if self.redirect_devices:
            if func in _IDENTITY_METHODS:
                return args[0]
            args, kwargs = redirect_device_arguments(func, args, kwargs)
        return func(*args, **kwargs)
