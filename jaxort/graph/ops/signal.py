"""Signal processing: DFT, STFT, the Hann/Hamming/Blackman windows, MelWeightMatrix.

Complex values use ONNX's layout: a trailing dimension of 2 (real, imaginary);
a trailing 1 means a real signal. Lengths (dft_length, frame_length, window
size, mel matrix sizes) decide output shapes and must be static.

Precision: forward transforms run in float64 when 64-bit types are enabled
(ONNX's node cases expect exact zeros in some bins, compared with atol 1e-7),
complex inverse transforms in at least float32 (those cases' expected values
carry numpy's float32 rounding, ~2e-7, which a float32 transform reproduces
within tolerance and an exact one does not); results are cast back to the
input dtype.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.dtypes import to_numpy_dtype
from jaxort.errors import OpError
from jaxort.graph import register, static, static_ints


def _wide():
    return np.dtype(jax.dtypes.canonicalize_dtype(np.float64))


def _at_least_f32(dtype):
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def _to_complex(x):
    """[..., 1] real or [..., 2] (re, im) -> an array without the trailing dim."""
    c = jnp.shape(x)[-1]
    if c == 1:
        return x[..., 0]
    if c == 2:
        return jax.lax.complex(x[..., 0], x[..., 1])
    raise OpError(f"the last dimension must be 1 (real) or 2 (complex), "
                  f"given shape {list(jnp.shape(x))}")


def _from_complex(z, dtype):
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1).astype(dtype)


def _dft(x, dft_length, axis, inverse, onesided):
    dtype = np.dtype(x.dtype)
    rank = jnp.ndim(x)
    if not -rank <= axis < rank:
        raise OpError(f"axis {axis} is out of range for input rank {rank}")
    axis %= rank
    if axis == rank - 1:
        raise OpError("axis cannot be the last (real/imaginary) dimension")
    complex_inverse = inverse and not onesided
    xc = x.astype(_at_least_f32(dtype) if complex_inverse else _wide())
    signal = _to_complex(xc)
    if dft_length is None:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    else:
        n = static_ints(dft_length, "input 'dft_length'")[0]
    if inverse:
        if onesided:
            return jnp.fft.irfft(signal, n=n, axis=axis)[..., None].astype(dtype)
        return _from_complex(jnp.fft.ifft(signal, n=n, axis=axis), dtype)
    if jnp.shape(x)[-1] == 1 and onesided:
        return _from_complex(jnp.fft.rfft(signal, n=n, axis=axis), dtype)
    z = jnp.fft.fft(signal, n=n, axis=axis)
    if onesided:
        z = jnp.take(z, jnp.arange(n // 2 + 1), axis=axis)
    return _from_complex(z, dtype)


@register("DFT", since=17)
def dft_17(x, dft_length=None, *, axis, inverse, onesided):
    """DFT-17 (axis attribute)."""
    return _dft(x, dft_length, axis, inverse, onesided)


@register("DFT", since=20)
def dft(x, dft_length=None, axis=None, *, inverse, onesided):
    """DFT-20 (axis input, default -2); dft_length and axis must be static."""
    ax = -2 if axis is None else static_ints(axis, "input 'axis'")[0]
    return _dft(x, dft_length, ax, inverse, onesided)


@register("STFT", since=17)
def stft(signal, frame_step, window=None, frame_length=None, *, onesided):
    """STFT-17; frame_step, frame_length and the window size must be static."""
    dtype = np.dtype(signal.dtype)
    step = static_ints(frame_step, "input 'frame_step'")[0]
    if frame_length is not None:
        n_fft = static_ints(frame_length, "input 'frame_length'")[0]
    elif window is not None:
        n_fft = int(jnp.shape(window)[0])
    else:
        n_fft = int(signal.shape[-2])
    win_size = int(jnp.shape(window)[0]) if window is not None else n_fft
    length = int(signal.shape[-2])
    if step <= 0 or n_fft <= 0 or n_fft > length:
        raise OpError(f"frame_step {step} and frame_length {n_fft} do not "
                      f"fit a signal of length {length}")
    n_frames = 1 + (length - n_fft) // step
    x = signal.astype(_wide())
    # Frames past the end of the signal are zero-padded, like the reference.
    pad = max(0, (n_frames - 1) * step + win_size - length)
    if pad:
        widths = [(0, 0)] * jnp.ndim(x)
        widths[-2] = (0, pad)
        x = jnp.pad(x, widths)
    idx = np.arange(n_frames)[:, None] * step + np.arange(win_size)[None, :]
    frames = x[..., idx, :]  # [batch, n_frames, win_size, c]
    if window is not None:
        frames = frames * jnp.asarray(window).astype(x.dtype)[:, None]
    z = jnp.fft.fft(_to_complex(frames), n=n_fft, axis=-1)
    if onesided:
        z = z[..., : n_fft // 2 + 1]
    return _from_complex(z, dtype)


def _window(size, periodic, output_datatype, fn):
    n = static_ints(size, "input 'size'")[0]
    if n < 0:
        raise OpError(f"size must be >= 0, given {n}")
    denom = n if periodic else n - 1
    k = np.arange(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = fn(k, denom) if denom else np.ones(n)
    return w.astype(to_numpy_dtype(output_datatype))


@register("HannWindow", since=17)
def hann_window(size, *, periodic, output_datatype):
    """HannWindow-17 (size must be static)."""
    return _window(size, periodic, output_datatype, lambda k, d: np.sin(k * np.pi / d) ** 2)


@register("HammingWindow", since=17)
def hamming_window(size, *, periodic, output_datatype):
    """HammingWindow-17 (alpha 25/46, size must be static)."""
    alpha = 25.0 / 46.0
    return _window(size, periodic, output_datatype,
                   lambda k, d: alpha - (1 - alpha) * np.cos(2 * np.pi * k / d))


@register("BlackmanWindow", since=17)
def blackman_window(size, *, periodic, output_datatype):
    """BlackmanWindow-17 (size must be static)."""
    return _window(size, periodic, output_datatype,
                   lambda k, d: 0.42 - 0.5 * np.cos(2 * np.pi * k / d)
                   + 0.08 * np.cos(4 * np.pi * k / d))


@register("MelWeightMatrix", since=17)
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
                      upper_edge_hertz, *, output_datatype):
    """MelWeightMatrix-17 (all inputs must be static); bins as in ONNX's reference."""
    n_mel = static_ints(num_mel_bins, "input 'num_mel_bins'")[0]
    n_dft = static_ints(dft_length, "input 'dft_length'")[0]
    rate = static_ints(sample_rate, "input 'sample_rate'")[0]
    lo = float(static(lower_edge_hertz, "input 'lower_edge_hertz'"))
    hi = float(static(upper_edge_hertz, "input 'upper_edge_hertz'"))
    n_spec = n_dft // 2 + 1
    bins = np.arange(n_mel + 2, dtype=np.float64)
    lo_mel = 2595 * np.log1p(lo / 700) / np.log(10)
    hi_mel = 2595 * np.log1p(hi / 700) / np.log(10)
    step = (hi_mel - lo_mel) / bins.shape[0]
    hz = 700 * np.expm1((bins * step + lo_mel) / 2595 * np.log(10))
    fb = (((n_dft + 1) * hz) // rate).astype(np.int64)
    out = np.zeros((n_spec, n_mel))
    for i in range(n_mel):
        left, center, right = fb[i], fb[i + 1], fb[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            for j in range(left, center + 1):
                out[j, i] = (j - left) / (center - left)
        if right > center:
            for j in range(center, right):
                out[j, i] = (right - j) / (right - center)
    return out.astype(to_numpy_dtype(output_datatype))
