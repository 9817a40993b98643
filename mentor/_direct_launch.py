"""The update kernel launched without Triton's per-call binding (private; :class:`mentor.suite.FusedMetrics` uses it).

:func:`mentor._fused_kernel.launcher` calls the kernel through ``JITFunction.run`` at every update. That
call binds the 20 arguments (22 with top-k), specializes each one (pointer alignment, integers equal to 1
or divisible by 16), hashes the result to find the compiled kernel, builds the launch metadata and calls the
compiled kernel's launcher (``CompiledKernel.run``). For one input layout all of that gives the same answer every
time, except the pointers' alignment. :func:`launcher` here makes the first launch through
``JITFunction.run``, keeps the compiled kernel it returns, and afterwards calls its launcher directly, with
the same positional arguments ``JITFunction.run`` passes (``triton/runtime/jit.py``, the ``kernel.run(...)``
call at the end of ``run``, identical in Triton 3.6 and 3.8), launch metadata ``None`` and no hooks.

It falls back to ``JITFunction.run`` for a launch when the direct call would not be what Triton does:

- a pointer argument is not 16-byte aligned (the kernel was compiled assuming that it is, because the
  first launch's pointers were: :data:`ALIGNMENT`);
- the current CUDA device is not the inputs' (Triton launches on the current device);
- a launch hook is set (``triton.knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``: Proton and
  other profilers), which needs the launch metadata;
- the installed Triton is outside :data:`VERSIONS`, where the launcher's calling convention was read
  (and, for 3.6, run on the GPU); there every launch goes through ``JITFunction.run``.

Limits: the direct call skips ``JITFunction.run``'s check that the kernel's global variables have not
changed since it was compiled (this kernel reads none) and its pre-run hooks (none are registered).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mentor import _fused_kernel as _kernel

ALIGNMENT = 16
"""Triton specializes a pointer argument on whether its address is divisible by this (``data_ptr() % 16`` in
``BaseBackend.get_arg_specialization``, ``triton/backends/compiler.py``)."""
VERSIONS = ((3, 6), (3, 8))
"""The Triton releases (major, minor), inclusive, whose ``JITFunction.run`` calls ``CompiledKernel.run`` as
this module does."""


def triton_version() -> tuple[int, int] | None:
    """``(major, minor)`` of the installed Triton, or None without it.

    Example:
        >>> v = triton_version()
        >>> v is None or (isinstance(v, tuple) and len(v) == 2)
        True
    """
    if not _kernel.AVAILABLE:
        return None
    major, minor = _kernel.triton.__version__.split(".")[:2]
    return int(major), int(minor)


def supported(version: tuple[int, int] | None) -> bool:
    """Whether launches may bypass ``JITFunction.run`` with this Triton version (:data:`VERSIONS`).

    Example:
        >>> supported((3, 6)), supported((3, 8)), supported((3, 2)), supported((4, 0)), supported(None)
        (True, True, False, False, False)
    """
    return version is not None and VERSIONS[0] <= version <= VERSIONS[1]


def hooks_idle() -> bool:
    """Whether no Triton launch hook is set: each is None or an empty ``HookChain`` (Triton 3.6 and later).

    Example:
        >>> hooks_idle() if triton_version() else True
        True
    """
    runtime = _kernel.triton.knobs.runtime
    return all(hook is None or (isinstance(getattr(hook, "calls", None), list) and not hook.calls)
               for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook))


def aligned(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every tensor's data pointer is divisible by :data:`ALIGNMENT`.

    Example:
        >>> x = torch.zeros(8)
        >>> aligned([x]), aligned([x[1:]])
        (True, False)
    """
    bits = 0
    for tensor in tensors:
        bits |= tensor.data_ptr()
    return bits % ALIGNMENT == 0


class DirectLauncher:
    """``run(loss, preds, target, states)`` for one input layout, as :func:`mentor._fused_kernel.launcher`'s, that
    launches the compiled kernel directly once Triton has compiled it (see the module docstring).

    ``direct`` counts the launches that bypassed ``JITFunction.run`` and ``bound`` those that went through it
    (the first, and every fallback).

    With ``top_k`` (the ks above 1, ascending) it launches ``_top_k_kernel``, whose ``states`` end with
    ``top_k_hits`` (:func:`mentor._fused_kernel.kernel_for`).

    Example (making one launches nothing; running it needs CUDA tensors):
        >>> logits, labels = torch.randn(32, 1000), torch.randint(0, 1000, (32,))
        >>> run = DirectLauncher(logits, labels, num_classes=1000, ignore_index=None)
        >>> run.direct, run.bound, run.grid
        (0, 0, 8)
    """

    def __init__(self, preds: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int | None,
                 top_k: tuple[int, ...] = ()) -> None:
        ints, constants, self.grid = _kernel._arguments(preds, target, num_classes, ignore_index, top_k)
        self._ints, self._constants = ints, constants
        jit = _kernel.kernel_for(top_k) if _kernel.AVAILABLE else None
        tensors = 10 if top_k else 9  # the states, then top_k_hits with top-k
        # the kernel's parameters after the tensors, in order: the integers, then the constexprs
        expected = ["n", "num_classes", "preds_row_stride", "preds_col_stride", "target_stride", "ignore_index",
                    *constants]
        if jit is not None and list(jit.arg_names[tensors:]) != expected:
            raise RuntimeError(f"the update kernel's parameters changed ({jit.arg_names[tensors:]}); "
                               f"update DirectLauncher.")
        self._tail = (*ints, *constants.values())
        self._jit = jit[(self.grid,)] if jit is not None else None
        self._index = target.device.index
        self._compiled: Any = None
        self._get_stream: Any = None
        self.direct = 0
        self.bound = 0

    def _through_triton(self, args: tuple[torch.Tensor, ...]) -> Any:
        """One launch through ``JITFunction.run`` on the inputs' device; returns the compiled kernel."""
        self.bound += 1
        if torch.cuda.current_device() == self._index:
            return self._jit(*args, *self._ints, **self._constants)
        with torch.cuda.device(self._index):
            return self._jit(*args, *self._ints, **self._constants)

    def __call__(self, loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor,
                 states: Sequence[torch.Tensor]) -> None:
        args = (preds, target, loss, *states)
        compiled = self._compiled
        if (compiled is not None and aligned(args) and torch.cuda.current_device() == self._index
                and hooks_idle()):
            compiled.run(self.grid, 1, 1, self._get_stream(self._index), compiled.function,
                         compiled.packed_metadata, None, None, None, *args, *self._tail)
            self.direct += 1
            return
        kernel = self._through_triton(args)
        if compiled is None and aligned(args) and supported(triton_version()):
            self._get_stream = _stream_getter()
            self._compiled = kernel


def _stream_getter() -> Any:
    """Triton's own ``get_current_stream(device_index)`` (torch's raw current stream), as ``JITFunction.run`` uses."""
    from triton.runtime import driver

    return driver.active.get_current_stream


def launcher(preds: torch.Tensor, target: torch.Tensor, num_classes: int,
             ignore_index: int | None, top_k: tuple[int, ...] = ()) -> _kernel.Launcher:
    """A :class:`DirectLauncher` for inputs laid out as ``preds`` and ``target``; a drop-in for
    :func:`mentor._fused_kernel.launcher` (same arguments, same ``run``).

    Example:
        >>> run = launcher(torch.randn(4, 10), torch.randint(0, 10, (4,)), num_classes=10, ignore_index=-100)
        >>> run.grid, launcher(torch.randn(4, 10), torch.randint(0, 10, (4,)), 10, None, top_k=(5,))._tail[-1]
        (1, (5,))
    """
    return DirectLauncher(preds, target, num_classes, ignore_index, top_k)
