"""A drop-in for ``onnxruntime.training.api`` that trains with JAX.

Change one import and an ONNX Runtime on-device training script runs on
JAX (CPU, GPU or TPU), with the same artifacts and checkpoint files::

    from jaxort.api import CheckpointState, Module, Optimizer, LinearLRScheduler

    state = CheckpointState.load_checkpoint("checkpoint")
    module = Module("training_model.onnx", state, "eval_model.onnx", device="cpu")
    optimizer = Optimizer("optimizer_model.onnx", module)
    module.train()
    loss = module(inputs, labels)
    optimizer.step()
    module.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, "checkpoint_out", include_optimizer_state=True)

Names, signatures and behaviour follow onnxruntime-training 1.19.2. The
differences, all deliberate:

- Arrays in and out are numpy (JAX arrays are accepted as inputs), as in
  ORT; ``Module.get_contiguous_parameters`` returns :class:`OrtValue`, a
  host tensor with the methods of ORT's OrtValue (``numpy()``, ``shape()``,
  ``data_type()``, ...), and ``copy_buffer_to_parameters`` takes it, ORT's
  OrtValue, numpy or JAX.
- ``LinearLRScheduler(optimizer, warmup_step_count, total_step_count,
  initial_lr)`` uses the counts as documented; ORT 1.19.2's Python binding
  swaps them.
- An ``Optimizer`` built on a state loaded with optimizer state starts from
  the saved group's learning rate; ORT starts at 0.001.
- Out-of-order calls raise :class:`jaxort.errors.StateError`:
  ``optimizer.step()`` before any train step (ORT steps on zero gradients),
  eval mode without an eval model (ORT's binding crashes), export without
  an eval model.
- ``device`` may also be ``"gpu"`` or ``"tpu"``; ``session_options`` is
  accepted and ignored.
- Setting a parameter with the wrong shape or dtype raises
  :class:`jaxort.errors.InputError` (a ValueError; ORT raises RuntimeError).

This package is a facade over :class:`jaxort.training.SessionState`, as is
:mod:`jaxort.session`; nothing below the facades may import it.
"""

from jaxort.api._checkpoint_state import CheckpointState, Parameter, Parameters, Properties
from jaxort.api._module import LinearLRScheduler, Module, Optimizer
from jaxort.api._ortvalue import OrtValue

__all__ = [
    "CheckpointState",
    "LinearLRScheduler",
    "Module",
    "Optimizer",
    "OrtValue",
    "Parameter",
    "Parameters",
    "Properties",
]
