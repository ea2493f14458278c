"""Testing helpers for users of jaxort: ONNX conformance runs and hypothesis strategies.

``jaxort.testing.conformance`` runs ONNX's backend node test cases through
``jaxort.backend``.
"""
