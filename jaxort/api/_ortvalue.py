"""OrtValue of ``jaxort.api``: a host tensor with the methods of ONNX Runtime's OrtValue.

``onnxruntime.training.api.Module.get_contiguous_parameters`` returns ORT's
C-level ``OrtValue``, and ORT scripts call its methods (``.numpy()`` above
all). jaxort returns this class instead: the same methods with the same
results, over a numpy array, and ``numpy.asarray`` works on it too.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from jaxort.dtypes import onnx_type_name, to_numpy_dtype, to_onnx_type
from jaxort.errors import InputError

__all__ = ["OrtValue"]

_DEVICES = ("cpu",)


class OrtValue:
    """A tensor on the host, with ORT's ``OrtValue`` methods.

    Example:
      >>> v = OrtValue.ortvalue_from_numpy(np.arange(3, dtype=np.float32))
      >>> v.shape(), v.data_type(), v.element_type(), v.device_name()
      ([3], 'tensor(float)', 1, 'Cpu')
      >>> v.numpy()
      array([0., 1., 2.], dtype=float32)
    """

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray):
        """Wraps a numpy array (copied); use :meth:`ortvalue_from_numpy` as in ORT."""
        if not isinstance(array, np.ndarray):
            raise InputError(f"OrtValue holds a numpy array, got {type(array).__name__}")
        self._array = np.array(array, copy=True, order="C")

    @classmethod
    def _owning(cls, array: np.ndarray) -> "OrtValue":
        """Wraps an array nobody else holds, without the copy ``__init__`` makes."""
        value = cls.__new__(cls)
        value._array = np.ascontiguousarray(array)
        return value

    @staticmethod
    def ortvalue_from_numpy(numpy_obj: np.ndarray, device_type: str = "cpu", device_id: int = 0) -> "OrtValue":
        """A copy of ``numpy_obj`` (ORT's ``OrtValue.ortvalue_from_numpy``); only ``"cpu"`` devices."""
        _check_device(device_type, device_id)
        return OrtValue(np.asarray(numpy_obj))

    @staticmethod
    def ortvalue_from_shape_and_type(shape: Sequence[int], element_type: Any, device_type: str = "cpu",
                                     device_id: int = 0) -> "OrtValue":
        """A zero-filled tensor of ``shape`` and ``element_type`` (a numpy type or an ONNX type number)."""
        _check_device(device_type, device_id)
        if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
            dtype = to_numpy_dtype(int(element_type))
        else:
            dtype = np.dtype(element_type)
        return OrtValue(np.zeros(tuple(int(d) for d in shape), dtype))

    def numpy(self) -> np.ndarray:
        """A numpy copy of the tensor."""
        return self._array.copy()

    def shape(self) -> list[int]:
        """The dimensions, as a list (ORT's ``shape()`` is a method)."""
        return list(self._array.shape)

    def data_type(self) -> str:
        """The ONNX type string, e.g. ``'tensor(float)'``."""
        return f"tensor({onnx_type_name(to_onnx_type(self._array.dtype)).lower()})"

    def element_type(self) -> int:
        """The ONNX element type number (``TensorProto.FLOAT`` is 1)."""
        return to_onnx_type(self._array.dtype)

    def device_name(self) -> str:
        """``'Cpu'``: the value lives in host memory."""
        return "Cpu"

    def data_ptr(self) -> int:
        """The address of the first element."""
        return self._array.ctypes.data

    def has_value(self) -> bool:
        """True: the value holds a tensor."""
        return True

    def is_tensor(self) -> bool:
        """True: the value is a tensor."""
        return True

    def is_sparse_tensor(self) -> bool:
        """False: never a sparse tensor."""
        return False

    def is_tensor_sequence(self) -> bool:
        """False: never a tensor sequence."""
        return False

    def update_inplace(self, np_arr: np.ndarray) -> None:
        """Copies ``np_arr`` into the tensor; its shape and dtype must match (InputError)."""
        np_arr = np.asarray(np_arr)
        if np_arr.shape != self._array.shape or np_arr.dtype != self._array.dtype:
            raise InputError(f"update_inplace: expected {self._array.dtype}{list(self._array.shape)}, "
                             f"got {np_arr.dtype}{list(np_arr.shape)}")
        np.copyto(self._array, np_arr)

    def __array__(self, dtype: Optional[Any] = None, copy: Optional[bool] = None) -> np.ndarray:
        if copy is False and dtype is not None and np.dtype(dtype) != self._array.dtype:
            raise ValueError("OrtValue: a dtype conversion needs a copy")
        out = self._array if dtype is None else self._array.astype(dtype, copy=False)
        return out.copy() if copy else out

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()}, shape={self.shape()})"


def _check_device(device_type: str, device_id: int) -> None:
    if str(device_type).lower() not in _DEVICES or int(device_id) != 0:
        raise InputError(f"jaxort.api.OrtValue lives on the host: device {device_type!r}:{device_id} "
                         "is not supported (JAX places the training state itself; use Module(device=...))")
