"""check_input: one check of a value fed for a declared input, for JaxGraph and the training layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxort.errors import InputError
from jaxort.graph import check_input

F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)


def test_a_matching_array_is_returned_as_is():
    x = np.zeros((3, 2), np.float32)
    assert check_input("x", ("N", 2), F32, x) is x
    assert check_input("x", None, None, x) is x  # nothing declared
    y = jnp.zeros((3, 2), jnp.float32)
    assert check_input("x", (None, 2), F32, y) is y


def test_lists_take_the_declared_dtype_unless_refused():
    out = check_input("x", ("N", 2), F32, [[1, 2], [3, 4]])
    assert out.dtype == F32 and out.shape == (2, 2)
    np.testing.assert_array_equal(out, [[1, 2], [3, 4]])
    assert check_input("y", ("N",), I64, (1, 2)).dtype == I64
    assert check_input("s", (), F32, 2.5) == np.float32(2.5)
    with pytest.raises(InputError, match=r"input 'y': expected dtype int64, given a list of float64 values"):
        check_input("y", ("N",), I64, [1.5])
    with pytest.raises(InputError, match=r"input 'b': expected dtype bool, given a list of int64 values"):
        check_input("b", ("N",), np.dtype(bool), [1, 0])
    with pytest.raises(InputError, match=r"^input 'x': expected an array of dtype float32 shape \['N', 2\], "
                                         r"given list$"):
        check_input("x", ("N", 2), F32, [[1, 2]], lists=False)


def test_non_arrays_are_refused():
    with pytest.raises(InputError, match=r"^input 'x': expected an array of dtype float32 shape any, given NoneType$"):
        check_input("x", None, F32, None)
    with pytest.raises(InputError, match=r"^param 'w': expected an array, given str$"):
        check_input("w", None, None, "abc", what="param")


def test_a_jax_array_narrowed_by_jax_stands_for_the_declared_dtype():
    x = jnp.zeros(3, jnp.int32)
    wide = jax.dtypes.canonicalize_dtype(I64) == I64
    if wide:  # 64-bit mode on: an int32 JAX array is a mismatch like any other
        with pytest.raises(InputError, match="expected dtype int64, given int32"):
            check_input("y", ("N",), I64, x)
    else:
        assert check_input("y", ("N",), I64, x) is x
    with pytest.raises(InputError, match="expected dtype int64, given int32"):
        check_input("y", ("N",), I64, np.zeros(3, np.int32))  # numpy: the caller's mistake


def test_the_two_message_forms():
    x = np.zeros((2, 5), np.float64)
    with pytest.raises(InputError, match=r"^input 'x': expected dtype float32, given float64; ONNX Runtime "
                                         r"refuses it too, .* pass it as float32 \(e.g. x.astype\(np.float32\)\)$"):
        check_input("x", ("N", 6), F32, x)
    with pytest.raises(InputError, match=r"^input 'x': expected shape \['N', 6\] dtype float32, given shape "
                                         r"\[2, 5\] dtype float32$"):
        check_input("x", ("N", 6), F32, x.astype(np.float32))
    with pytest.raises(InputError, match=r"^param 'x' has the wrong dtype and shape: expected shape \['N', 6\] "
                                         r"dtype float32, given shape \[2, 5\] dtype float64$"):
        check_input("x", ("N", 6), F32, x, what="param", combined=True)
    with pytest.raises(InputError, match=r"^input 'x' has the wrong shape: expected shape \[2\] dtype None, "
                                         r"given shape \[2, 5\] dtype float64$"):
        check_input("x", (2,), None, x, combined=True)
