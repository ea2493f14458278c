"""settle_allocator (jaxort/graph/_host_memory.py): glibc keeps a freed block for the next step.

Each case runs in a fresh interpreter that loads the module from its file
alone (importing jaxort, JAX or numpy first would move glibc's thresholds
by itself): a block of 8 MiB is allocated, written and freed twice, and the
second round's minor page faults are counted. Without the settling glibc
maps the block anew each round (2,048 faults of 4 KiB); with it, the second
round reuses the first's pages.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from jaxort.graph import JaxGraph, _host_memory

MODULE = pathlib.Path(_host_memory.__file__)

SCRIPT = """
import ctypes, importlib.util, resource, sys
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 8 << 20
def rounds():
    block = libc.malloc(SIZE)
    ctypes.memset(block, 1, SIZE)
    libc.free(block)
if sys.argv[2] == "settle":
    spec = importlib.util.spec_from_file_location("host_memory", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.settle_allocator() is True
rounds()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _second_round_faults(arm: str) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(MODULE), arm], capture_output=True, text=True,
                         timeout=120, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc thresholds are Linux's")
def test_a_freed_block_is_reused_instead_of_mapped_again():
    plain = _second_round_faults("plain")
    if plain < 1024:
        pytest.skip(f"this C library keeps an 8 MiB block without settling ({plain} faults)")
    settled = _second_round_faults("settle")
    assert settled < plain // 10, (plain, settled)


def test_a_graph_settles_the_allocator_before_its_first_step():
    _host_memory.settle_allocator.cache_clear()
    JaxGraph(_identity_model())
    info = _host_memory.settle_allocator.cache_info()
    assert (info.misses, info.currsize) == (1, 1)
    assert _host_memory.settle_allocator() is sys.platform.startswith("linux")


def _identity_model():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
