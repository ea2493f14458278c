"""The training layer: TrainState, TrainProgram, ORT optimizers and schedules.

``TrainProgram.from_artifacts(training_model, eval_model, optimizer_model)``
reads ONNX Runtime Training artifacts (or jaxort's); its steps are pure,
jitted functions over an immutable :class:`TrainState`::

    program = TrainProgram.from_artifacts("training_model.onnx", "eval_model.onnx",
                                          "optimizer_model.onnx", checkpoint=ckpt)
    state = set_learning_rate(program.init_state(ckpt), 0.01)
    state, (loss,) = program.train_step(state, x, y)
    state = program.lazy_reset_grad(program.optimizer_step(state))
    ckpt_out = program.to_checkpoint(state)

ORT's optimizers are optax transforms (:func:`scale_by_ort_adamw`,
:func:`scale_by_ort_sgd`), and any optax transform trains as an
:class:`OptaxOptimizer`, its whole state saved in checkpoints; learning-rate schedules are optax schedules of the
optimizer step (:func:`linear_lr_schedule`, applied with :func:`apply_schedule`).
:func:`pack` puts a state's small tensors into one buffer per dtype (a
:class:`PackedState`, which every step and state helper takes as it takes a
TrainState, which reads like one, and which trains faster: per-buffer costs
dominate small models on CPU); :func:`unpack` gives the TrainState back. :class:`SessionState` is a checkpoint state and the session over it as one
value, the core both facades delegate to; :class:`ParameterLayout` gives
ORT's parameter-buffer order. :func:`shard` places a state on a
``jax.sharding.Mesh`` (data parallel or fully sharded, :mod:`jaxort.training.sharding`);
:mod:`jaxort.training.distributed` (also ``jaxort.distributed``) runs it over
several hosts. Artifacts are read, generated and exported by
:mod:`jaxort.training.artifacts`. This layer knows nothing of the session
facades.
"""

from jaxort.training.optimizers import (
    DEFAULT_LEARNING_RATE,
    OptaxOptimizer,
    OrtOptimizer,
    ScaleByOrtAdamWState,
    ScaleByOrtSgdState,
    adamw_optimizer,
    opt_state_from_checkpoint_states,
    opt_state_to_checkpoint_states,
    optimizer_from_model,
    ort_adamw,
    ort_sgd,
    scale_by_ort_adamw,
    scale_by_ort_sgd,
    sgd_optimizer,
)
from jaxort.training.artifacts.read import (
    TrainingModelInfo,
    describe_training_model,
    slice_model,
)
from jaxort.training.layout import ParameterLayout
from jaxort.training.packing import PackedState, Packing, pack, unpack
from jaxort.training.pending import Pending
from jaxort.training.precision import Policy, bfloat16_policy, cast_model
from jaxort.training.program import TrainProgram
from jaxort.training.schedules import linear_lr_schedule
from jaxort.training.sharding import Placement, gather, make_mesh, shard
from jaxort.training.process import PROCESS_SEED, PROGRAMS, ProcessSeed, ProgramCache
from jaxort.training.session_state import SessionState
from jaxort.training.state import (
    TrainState,
    apply_schedule,
    restore_optimizer_state,
    set_initial_learning_rate,
    set_learning_rate,
    set_seed,
    state_from_checkpoint,
    state_to_checkpoint,
)

__all__ = [
    "DEFAULT_LEARNING_RATE",
    "OptaxOptimizer",
    "OrtOptimizer",
    "PROCESS_SEED",
    "PackedState",
    "Pending",
    "Packing",
    "PROGRAMS",
    "ParameterLayout",
    "Placement",
    "Policy",
    "ProcessSeed",
    "ProgramCache",
    "ScaleByOrtAdamWState",
    "ScaleByOrtSgdState",
    "SessionState",
    "TrainProgram",
    "TrainState",
    "TrainingModelInfo",
    "adamw_optimizer",
    "apply_schedule",
    "bfloat16_policy",
    "cast_model",
    "describe_training_model",
    "gather",
    "linear_lr_schedule",
    "make_mesh",
    "opt_state_from_checkpoint_states",
    "opt_state_to_checkpoint_states",
    "optimizer_from_model",
    "pack",
    "ort_adamw",
    "ort_sgd",
    "scale_by_ort_adamw",
    "restore_optimizer_state",
    "scale_by_ort_sgd",
    "set_initial_learning_rate",
    "set_learning_rate",
    "set_seed",
    "shard",
    "sgd_optimizer",
    "slice_model",
    "state_from_checkpoint",
    "state_to_checkpoint",
    "unpack",
]
