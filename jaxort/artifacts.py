"""Training artifact generation, a drop-in for ``onnxruntime.training.artifacts``.

``from jaxort import artifacts`` gives the names of
``onnxruntime.training.artifacts``: :func:`generate_artifacts`,
:class:`LossType` and :class:`OptimType`. The implementation lives in
:mod:`jaxort.training.artifacts`, which documents what matches ONNX Runtime
Training 1.19.2 and what differs (the training model has no gradient graph).
"""

from jaxort.training.artifacts import Artifacts, LossType, OptimType, generate_artifacts
from jaxort.training.export import export_model_for_inferencing

__all__ = ["Artifacts", "LossType", "OptimType", "export_model_for_inferencing", "generate_artifacts"]
