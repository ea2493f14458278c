"""The layer arrows on jaxort's real import graph, and its private names.

Every module of the package is parsed with ``ast`` (nothing is imported) and
each ``import`` statement, at module level or inside a function, becomes an
arrow to the jaxort module it loads. A module may import only its own layer or
lower ones, and no two modules may import each other, directly or around a
loop. A module may import an underscore-named module or name only from its own
package (its directory) or a package inside it.

How an import names its target:

- ``import jaxort.a.b`` and ``from jaxort.a import b`` (``b`` a module) point
  at ``jaxort.a.b``; relative imports are resolved against the importer's
  package.
- ``from jaxort.graph import register`` points at the module that defines
  ``register``, found by following the package ``__init__``'s own re-export
  (``from jaxort.graph._registry import register``). So a module of
  ``jaxort/graph/ops`` that imports from its package depends on
  ``graph._registry``, not on ``graph/__init__.py``, and a package re-exporting
  its submodules while they import names from it is no cycle. A name the
  ``__init__`` defines itself points at the ``__init__``.
- ``from P import x`` in a module of package ``P`` itself (``from . import x``,
  or ``from jaxort.onnxblock import blocks`` in ``onnxblock/loss.py``) also
  points at ``P``'s ``__init__``: the name is read from that package's
  namespace, which is being built while its ``__init__`` imports the module.
  ``from P.x import y`` and ``import P.x`` name the module and do not.
- A package ``__init__`` that imports its modules by discovery
  (``pkgutil.iter_modules(__path__)``, as ``graph/ops`` does) points at each
  module of the package. ``importlib.import_module`` with a computed name (the
  lazy submodules of ``jaxort/__init__.py``) is not an import statement and
  adds no arrow.
- Imports under ``if TYPE_CHECKING:`` count like any other.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "jaxort"

# Bottom up; a module may import its own layer or any layer before it.
LAYERS = ("format", "graph", "training", "testing", "facades")

# Path (relative to jaxort/, "/"-separated) -> layer. A directory covers all
# it holds; the longest match wins.
LAYER_OF_PATH = {
    "checkpoint/": "format",
    "_fbs/": "format",
    "dtypes.py": "format",
    "external_data.py": "format",
    "errors.py": "format",
    "__init__.py": "format",  # its submodules load lazily, by importlib
    "graph/": "graph",
    "backend.py": "graph",
    "training/": "training",
    "distributed.py": "training",  # re-exports jaxort.training.distributed
    "onnxblock/": "training",  # ORT's onnxblock API over jaxort.training.artifacts
    "testing/": "testing",
    "session.py": "facades",
    "_checkpoint_handle.py": "facades",
    "api/": "facades",
    "cli.py": "facades",
    "__main__.py": "facades",
    "demo.py": "facades",
    "train_loop.py": "facades",
    "inspection.py": "facades",
    "nnx.py": "facades",
    "equinox.py": "facades",
    "_onnx_modules.py": "facades",
}

# Known arrows exempt from the cycle check, each with a comment saying why and
# when it goes; none today (cli.py and __main__.py imported each other until
# __main__ became the only side that calls the other).
ALLOWED_CYCLE_EDGES: frozenset = frozenset()

# Imports of another package's private module or name: (importer, the
# imported path up to its first underscore-named part), each with why it is
# here; an entry goes when its import does. Only generated code is left.
ALLOWED_PRIVATE_IMPORTS: frozenset = frozenset({
    # The flatbuffers code `make fbs` generates, used by the checkpoint writer
    # alone; goes when it moves under checkpoint/ or gets a public name.
    ("jaxort.checkpoint._write", "jaxort._fbs"),
})


# --- reading the package -------------------------------------------------------


def find_modules(root: pathlib.Path, package: str = "jaxort") -> dict:
    """Returns module name -> (path, is_package) for every .py file under ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join([package, *parts])] = (path, is_package)
    return modules


def _base_package(module: str, is_package: bool, level: int) -> str:
    """The package a relative import of ``level`` dots in ``module`` starts from."""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = _base_package(module, is_package, node.level)
    return f"{base}.{node.module}" if node.module else base


def _package_of(module: str, is_package: bool) -> str:
    """The package a module belongs to: its directory."""
    return module if is_package else module.rpartition(".")[0]


def _discovers_submodules(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "iter_modules"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "pkgutil"):
            return True
    return False


class ImportGraph:
    """The arrows between the modules of one package, read from their sources."""

    def __init__(self, root: pathlib.Path, package: str = "jaxort"):
        self.package = package
        self.modules = find_modules(root, package)
        self._trees = {m: ast.parse(p.read_text(encoding="utf-8"), str(p))
                       for m, (p, _) in self.modules.items()}
        self.edges = {m: self._imports_of(m) for m in self.modules}

    def _ours(self, name: str) -> bool:
        return name == self.package or name.startswith(self.package + ".")

    def _reexport(self, package: str, name: str, seen: frozenset = frozenset()) -> str:
        """The module that defines ``name`` as ``from package import name`` sees it."""
        if f"{package}.{name}" in self.modules:
            return f"{package}.{name}"
        if package not in self.modules or not self.modules[package][1] or package in seen:
            return package
        for node in self._trees[package].body:  # only what the __init__ runs at import
            if isinstance(node, ast.ImportFrom):
                source = _absolute(node, package, True)
                for alias in node.names:
                    if (alias.asname or alias.name) == name and self._ours(source):
                        return self._reexport(source, alias.name, seen | {package})
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname == name and self._ours(alias.name):
                        return alias.name
        return package

    def _statements(self, module: str):
        """Yields ``(source, names)`` for each import statement of ``module`` that loads one of ours.

        ``names`` is None for ``import source``, the imported names for
        ``from source import ...`` (relative sources made absolute).
        """
        is_package = self.modules[module][1]
        for node in ast.walk(self._trees[module]):
            if isinstance(node, ast.Import):
                yield from ((a.name, None) for a in node.names if self._ours(a.name))
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node, module, is_package)
                if self._ours(source):
                    yield source, [a.name for a in node.names]

    def _imports_of(self, module: str) -> set:
        path, is_package = self.modules[module]
        tree = self._trees[module]
        targets = set()
        for source, names in self._statements(module):
            if names is None:
                targets.add(source)
                continue
            targets.update(self._reexport(source, name) for name in names)
            if source == _package_of(module, is_package):
                targets.add(source)  # read from the package's namespace, see the module docstring
        if is_package and _discovers_submodules(tree):
            prefix = module + "."
            targets.update(m for m in self.modules
                           if m.startswith(prefix) and "." not in m[len(prefix):])
        unknown = sorted(t for t in targets if t not in self.modules)
        assert not unknown, f"{module} ({path}) imports modules that do not exist: {unknown}"
        targets.discard(module)
        return targets

    def imported_paths(self, module: str):
        """Yields the dotted path of each module or name an import statement of ``module`` loads."""
        for source, names in self._statements(module):
            yield from ([source] if names is None else (f"{source}.{name}" for name in names))


def layer_of(module: str, modules: dict, root: pathlib.Path) -> str | None:
    """The layer of ``module`` by the longest matching entry of LAYER_OF_PATH."""
    rel = modules[module][0].relative_to(root).as_posix()
    best = None
    for key, layer in LAYER_OF_PATH.items():
        if (rel == key or (key.endswith("/") and rel.startswith(key))) and (
                best is None or len(key) > len(best[0])):
            best = (key, layer)
    return best[1] if best else None


# --- the checks ---------------------------------------------------------------------


def arrows_against_layers(edges: dict, layers: dict, order=LAYERS) -> list:
    """Returns "a (layer) -> b (layer)" for each arrow pointing to a higher layer."""
    rank = {name: i for i, name in enumerate(order)}
    bad = []
    for src in sorted(edges):
        for dst in sorted(edges[src]):
            if rank[layers[dst]] > rank[layers[src]]:
                bad.append(f"{src} ({layers[src]}) -> {dst} ({layers[dst]})")
    return bad


def import_cycles(edges: dict, allowed=frozenset()) -> list:
    """Returns each import cycle as a sorted list of modules (Tarjan's strongly
    connected components of more than one module), ignoring ``allowed`` arrows."""
    graph = {m: sorted(d for d in ds if (m, d) not in allowed and d in edges)
             for m, ds in edges.items()}
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(start):
        # Iterative, so a long chain of imports cannot hit the recursion limit.
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(graph[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(cycles)


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_imports(graph: ImportGraph) -> set:
    """Returns ``(importer, private path)`` for each import of another package's private module or name.

    The private path is the imported path up to its first underscore-named
    part (``jaxort.graph._model`` for ``from jaxort.graph._model import
    numpy_dtype``); it belongs to the package holding that part. A module may
    import it from its own package or a package inside it, or from inside
    the private package itself. The root package holds the layers side by
    side: a module directly in it (``cli.py``) may import only the root's own
    private modules, not those of the packages below.
    """
    found = set()
    for module, (_, is_package) in graph.modules.items():
        own = _package_of(module, is_package)
        for path in graph.imported_paths(module):
            parts = path.split(".")
            first = next((i for i, part in enumerate(parts) if _private(part)), None)
            if first is None:
                continue
            private = ".".join(parts[: first + 1])
            holder = ".".join(parts[:first])
            if not graph.modules.get(holder, (None, False))[1]:
                holder = holder.rpartition(".")[0]  # a private name of a module belongs to its package
            inside = holder.startswith(own + ".") and own != graph.package
            if holder == own or inside or module.startswith(private + "."):
                continue
            found.add((module, private))
    return found


# --- the real package ------------------------------------------------------------


@pytest.fixture(scope="module")
def jaxort_graph():
    return ImportGraph(ROOT)


def test_every_module_has_a_layer(jaxort_graph):
    missing = [m for m in jaxort_graph.modules if layer_of(m, jaxort_graph.modules, ROOT) is None]
    assert not missing, f"modules without a layer (add them to LAYER_OF_PATH): {missing}"


def test_arrows_point_down(jaxort_graph):
    modules = jaxort_graph.modules
    layers = {m: layer_of(m, modules, ROOT) for m in modules}
    bad = arrows_against_layers(jaxort_graph.edges, layers)
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_import_cycles(jaxort_graph):
    cycles = import_cycles(jaxort_graph.edges, ALLOWED_CYCLE_EDGES)
    assert not cycles, f"import cycles: {cycles}"


def test_allowed_cycle_edges_still_exist(jaxort_graph):
    # An exemption outliving its arrow would hide the next cycle there.
    stale = [e for e in ALLOWED_CYCLE_EDGES if e[1] not in jaxort_graph.edges.get(e[0], ())]
    assert not stale, f"remove these from ALLOWED_CYCLE_EDGES, the imports are gone: {stale}"


def test_no_private_imports_across_packages(jaxort_graph):
    bad = sorted(private_imports(jaxort_graph) - ALLOWED_PRIVATE_IMPORTS)
    assert not bad, ("imports of another package's private module or name (import a public name, or "
                     "make one):\n" + "\n".join(f"{m} imports {p}" for m, p in bad))


def test_allowed_private_imports_still_exist(jaxort_graph):
    stale = sorted(ALLOWED_PRIVATE_IMPORTS - private_imports(jaxort_graph))
    assert not stale, f"remove these from ALLOWED_PRIVATE_IMPORTS, the imports are gone: {stale}"


def test_the_graph_sees_the_known_arrows(jaxort_graph):
    edges = jaxort_graph.edges
    # A function-level import (the CLI loads the session only for its command).
    assert "jaxort.session" in edges["jaxort.cli"]
    # `from jaxort.graph import ...` resolves through the package to the defining module.
    assert "jaxort.graph._device" in edges["jaxort.backend"]
    # `from jaxort import checkpoint` in a module of jaxort itself also reads jaxort's namespace.
    assert {"jaxort", "jaxort.checkpoint"} <= edges["jaxort.inspection"]
    # Discovery imports every op module.
    assert "jaxort.graph.ops._common" in edges["jaxort.graph.ops"]


# --- the checker can fail ------------------------------------------------------


def _write(root: pathlib.Path, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_parser_on_a_fake_package(tmp_path):
    _write(tmp_path / "pkg", {
        "__init__.py": "",
        "low.py": "X = 1\n",
        "mid/__init__.py": "from pkg.mid._impl import helper\nVALUE = 2\n",
        "mid/_impl.py": "from .. import low\n\ndef helper():\n    from pkg import top\n",
        "mid/user.py": "from pkg.mid import helper, VALUE\nimport pkg.low as l\n",
        "plug/__init__.py": "import pkgutil\nfor m in pkgutil.iter_modules(__path__):\n    pass\n",
        "plug/a.py": "from .b import VALUE\n",
        "plug/b.py": "VALUE = 1\n",
        "top.py": "from .mid import user\n",
    })
    g = ImportGraph(tmp_path / "pkg", "pkg")
    assert g.edges["pkg.mid._impl"] == {"pkg.low", "pkg.top"}  # relative, and in a function
    assert g.edges["pkg.mid.user"] == {"pkg.mid._impl", "pkg.mid", "pkg.low"}  # re-export
    assert g.edges["pkg.mid"] == {"pkg.mid._impl"}
    assert g.edges["pkg.plug"] == {"pkg.plug.a", "pkg.plug.b"}
    assert g.edges["pkg.plug.a"] == {"pkg.plug.b"}
    assert g.edges["pkg.top"] == {"pkg.mid.user"}
    assert import_cycles(g.edges) == [["pkg.mid", "pkg.mid._impl", "pkg.mid.user", "pkg.top"]]


def test_checker_finds_a_bad_arrow_and_a_cycle():
    edges = {
        "jaxort.checkpoint._read": {"jaxort.errors"},
        "jaxort.errors": set(),
        "jaxort.graph._trace": {"jaxort.errors", "jaxort.training.state"},  # upward
        "jaxort.training.state": {"jaxort.training.program"},
        "jaxort.training.program": {"jaxort.training.layout"},
        "jaxort.training.layout": {"jaxort.training.state"},  # closes a loop of three
        "jaxort.session": {"jaxort.training.state", "jaxort.graph._trace"},
    }
    layers = {m: m.split(".")[1] for m in edges}
    layers.update({"jaxort.errors": "format", "jaxort.checkpoint._read": "format",
                   "jaxort.session": "facades"})
    assert arrows_against_layers(edges, layers) == [
        "jaxort.graph._trace (graph) -> jaxort.training.state (training)"]
    loop = ["jaxort.training.layout", "jaxort.training.program", "jaxort.training.state"]
    assert import_cycles(edges) == [loop]
    assert import_cycles(edges, {("jaxort.training.layout", "jaxort.training.state")}) == []
    edges["jaxort.errors"] = {"jaxort.checkpoint._read"}
    edges["jaxort.checkpoint._read"] = {"jaxort.errors"}
    assert import_cycles(edges) == [["jaxort.checkpoint._read", "jaxort.errors"], loop]


def test_a_package_import_from_inside_the_package_closes_a_cycle(tmp_path):
    # onnxblock's shape: the __init__ imports its modules, which import a
    # sibling through the package; naming the sibling module itself does not.
    _write(tmp_path / "pkg", {
        "__init__.py": "",
        "c/__init__.py": "from pkg.c import one, two\n",
        "c/_base.py": "",
        "c/one.py": "from pkg.c import _base\nVALUE = 1\n",
        "c/two.py": "from pkg.c.one import VALUE\n",
        "d/__init__.py": "from pkg.d import one\n",
        "d/_base.py": "",
        "d/one.py": "from pkg.d._base import *\nimport pkg.d._base\n",
    })
    g = ImportGraph(tmp_path / "pkg", "pkg")
    assert g.edges["pkg.c.one"] == {"pkg.c", "pkg.c._base"}
    assert g.edges["pkg.c.two"] == {"pkg.c.one"}
    assert g.edges["pkg.d.one"] == {"pkg.d._base"}
    assert import_cycles(g.edges) == [["pkg.c", "pkg.c.one", "pkg.c.two"]]
    assert import_cycles(g.edges, {("pkg.c.one", "pkg.c")}) == []


def test_private_imports_on_a_fake_package(tmp_path):
    _write(tmp_path / "pkg", {
        "__init__.py": "__version__ = '1'\n",
        "_version.py": "",
        "a/__init__.py": "from pkg.a._impl import f\n",
        "a/_impl.py": "def f():\n    pass\n\n_g = 1\n",
        "a/user.py": "from pkg.a._impl import _g\nfrom pkg.a.sub import _deep\nfrom . import _impl\n",
        "a/sub/__init__.py": "",
        "a/sub/_deep.py": "",
        "a/sub/up.py": "from pkg.a._impl import f\n",
        "b/__init__.py": "",
        "b/bad.py": ("from pkg.a._impl import f\nfrom ..a import _impl\nimport pkg.a.sub._deep\n"
                     "from pkg.a import f\n\ndef g():\n    from pkg.a.user import _hidden\n"),
        "_gen/__init__.py": "",
        "_gen/x.py": "from pkg._gen import y\nfrom pkg._gen.y import _z\n",
        "_gen/y.py": "",
        "top.py": "from pkg import __version__, _version\nfrom pkg.a._impl import f\nimport pkg._gen.x\n",
    })
    found = private_imports(ImportGraph(tmp_path / "pkg", "pkg"))
    assert found == {
        ("pkg.b.bad", "pkg.a._impl"),  # absolute and relative
        ("pkg.b.bad", "pkg.a.sub._deep"),
        ("pkg.b.bad", "pkg.a.user._hidden"),  # a private name, inside a function
        ("pkg.a.sub.up", "pkg.a._impl"),  # a package inside may not reach up
        ("pkg.top", "pkg.a._impl"),  # the root's modules use the packages' public names
    }


def test_layer_of_path(tmp_path):
    _write(tmp_path / "jaxort", {"__init__.py": "", "graph/ops/x.py": "", "cli.py": "",
                                 "training/artifacts/read.py": "", "stray.py": ""})
    modules = find_modules(tmp_path / "jaxort")
    root = tmp_path / "jaxort"
    assert layer_of("jaxort", modules, root) == "format"
    assert layer_of("jaxort.graph.ops.x", modules, root) == "graph"
    assert layer_of("jaxort.training.artifacts.read", modules, root) == "training"
    assert layer_of("jaxort.cli", modules, root) == "facades"
    assert layer_of("jaxort.stray", modules, root) is None
