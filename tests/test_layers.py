"""The import graph of the package: layers import only downward, and no two modules import each other.

Every import counts, at module level or inside a function (a lazy import is still a
dependency); only ``if TYPE_CHECKING:`` blocks are left out. docs/architecture.md
describes the layers.
"""

import ast
import pathlib

import workbench

ROOT = pathlib.Path(workbench.__file__).parent

#: Module-name prefixes by layer, bottom first; a module may import its own layer and those below.
LAYERS = [
    (
        "base",
        [
            "workbench.errors",
            "workbench.events",
            "workbench.training",
            "workbench.timeline",
            "workbench.spans",
            "workbench.stragglers",
            "workbench.clock",
            "workbench.datasets",
            "workbench.version",
        ],
    ),
    ("ops", ["workbench.ops"]),
    (
        "graph",
        [
            "workbench.graph",
            "workbench.loss_scale",
            "workbench.optimizers",
            "workbench.metrics",
            "workbench.layers",
            "workbench.models",
        ],
    ),
    ("checkpoints", ["workbench.checkpoint", "workbench.modelfile"]),
    ("strategies", ["workbench.strategies"]),
    (
        "devices and the training loop",
        [
            "workbench.gpu",
            "workbench.devices",
            "workbench.fitloop",
            "workbench.simulation",
            "workbench.lab_async",
        ],
    ),
    ("cluster", ["workbench.cluster"]),
    ("session", ["workbench.session", "workbench.fit_arguments", "workbench.validation", "workbench.model"]),
    ("studies", ["workbench.scaling"]),
    (
        "notebook surface",
        [
            "workbench.widgets",
            "workbench.dashboard",
            "workbench.notebook",
            "workbench.magics",
            "workbench.compare",
            "workbench",
        ],
    ),
    ("demo", ["workbench.demo"]),
]


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def layer(module: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank is not None, f"{module} is in no layer: add it to LAYERS (and to docs/architecture.md)"
    return rank


def _type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: pathlib.Path, name: str | None = None) -> set[str]:
    """The workbench modules ``path`` imports (``from pkg import submodule`` counts as the submodule)."""
    found: set[str] = set()

    def visit(node) -> None:
        if _type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "workbench")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "workbench":
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(MODULES)
            found.update(subs or {node.module})
            if len(subs) < len(node.names):
                found.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found - {name or module_name(path)}


GRAPH = {name: imports(path) for name, path in MODULES.items()}


def test_layers_import_only_downward():
    upward = [
        f"{m} ({LAYERS[layer(m)][0]}) imports {d} ({LAYERS[layer(d)][0]})"
        for m, deps in sorted(GRAPH.items())
        for d in sorted(deps)
        if layer(d) > layer(m)
    ]
    assert not upward, "\n".join(upward)


def module_edges() -> dict[str, set[str]]:
    """Module to the modules importing it runs: an import of a package runs its ``__init__``, so it
    counts as an import of every module that ``__init__`` imports (packages expanded in turn). The
    top package is the public surface the notebook layer's modules name (``import workbench as wb``):
    an edge into it is left out."""
    packages = {module_name(p) for p in ROOT.rglob("__init__.py")} - {"workbench"}

    def expand(deps, seen=()):
        out = set()
        for d in deps:
            if d in packages and d not in seen:
                out |= expand(GRAPH.get(d, ()), (*seen, d))
            elif d not in packages:
                out.add(d)
        return out

    return {m: expand(deps) - {m, "workbench"} for m, deps in GRAPH.items() if m not in packages | {"workbench"}}


def test_no_import_cycles_between_modules():
    """Edges into a package count as edges into what its ``__init__`` imports: a lazy
    ``from workbench.widgets import TrainingView`` in a module the views import is a loop."""
    edges = module_edges()
    state: dict[str, int] = {}

    def cycle_from(m, path):
        state[m] = 1
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                return [*path, m, d]
            if d not in state:
                found = cycle_from(d, [*path, m])
                if found:
                    return found
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state:
            found = cycle_from(m, [])
            assert found is None, " -> ".join(found)


def test_an_import_of_a_package_counts_as_an_import_of_its_modules():
    edges = module_edges()
    assert "workbench.widgets.training_view" in edges["workbench.notebook"]  # via widgets/__init__
    assert "workbench.widgets" not in edges["workbench.notebook"]


def test_the_checker_sees_lazy_imports_but_not_type_checking_ones(tmp_path):
    fake = tmp_path / "mod.py"
    fake.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from workbench.session import Session\n"
                    "def f():\n    from workbench.widgets import graph_view\n")  # fmt: skip
    assert imports(fake, "workbench.graph.fake") == {"workbench.widgets.graph_view"}
    assert layer("workbench.widgets.graph_view") > layer("workbench.graph.core")
