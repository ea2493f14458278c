"""ONNX Runtime Training artifacts: read, generate, export.

A drop-in for ``onnxruntime.training.artifacts`` (change one import)::

    from jaxort.training.artifacts import LossType, OptimType, generate_artifacts

    generate_artifacts(model, requires_grad=["fc.weight"], loss=LossType.CrossEntropyLoss,
                       optimizer=OptimType.AdamW, artifact_directory="out")

Three modules, one job each:

- :mod:`~jaxort.training.artifacts.read`: what the inputs and outputs of a
  ``training_model.onnx`` / ``eval_model.onnx`` mean (user inputs, labels,
  parameters, gradient buffers), and the forward-plus-loss slice jaxort
  differentiates.
- :mod:`~jaxort.training.artifacts.generate`: :func:`generate_artifacts`,
  which writes the four files ORT's ``generate_artifacts`` writes.
- :mod:`~jaxort.training.artifacts.export`: :func:`export_model_for_inferencing`,
  the inference model of trained parameters.

and what ``generate`` builds with:

- :mod:`~jaxort.training.artifacts.blocks`: the blocks of
  ``jaxort.onnxblock``, which build its losses and optimizer models;
- :mod:`~jaxort.training.artifacts.assemble`: the training and eval models
  of a forward + loss model, in ORT's layout;
- :mod:`~jaxort.training.artifacts.gradient`: the gradient graph ORT runs.

Part of the training layer: imports the graph and checkpoint layers, never
the facades.
"""

from jaxort.training.artifacts.export import export_model_for_inferencing, trim_inference_batchnorm_outputs
from jaxort.training.artifacts.generate import (
    Artifacts,
    LossType,
    OptimType,
    build_eval_model,
    build_optimizer_model,
    build_training_model,
    float_initializers,
    generate_artifacts,
)
from jaxort.training.artifacts.read import (
    CUSTOM_LOSS_KEY,
    CUSTOM_LOSS_LABELS_KEY,
    GRAD_BUFFER_SUFFIX,
    GRAD_OUTPUT_SUFFIX,
    LAZY_RESET_GRAD,
    TrainingModelInfo,
    custom_loss,
    describe_training_model,
    loss_label_names,
    slice_model,
)

__all__ = [
    "Artifacts",
    "CUSTOM_LOSS_KEY",
    "CUSTOM_LOSS_LABELS_KEY",
    "GRAD_BUFFER_SUFFIX",
    "GRAD_OUTPUT_SUFFIX",
    "LAZY_RESET_GRAD",
    "LossType",
    "OptimType",
    "TrainingModelInfo",
    "build_eval_model",
    "build_optimizer_model",
    "build_training_model",
    "custom_loss",
    "describe_training_model",
    "export_model_for_inferencing",
    "float_initializers",
    "generate_artifacts",
    "loss_label_names",
    "slice_model",
    "trim_inference_batchnorm_outputs",
]
