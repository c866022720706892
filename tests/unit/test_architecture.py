"""The shape of ``src/energysweep``: imports point one way, modules and functions stay readable.

The top level is the stages (docs/architecture.md): :data:`LAYERS` orders the top-level
packages and modules from the bottom up, and :data:`ALLOWED` says which of them each may import.
A package may import only what its row allows, and every allowed edge points to a lower layer,
so no package cycle can form.

These are checks on the source text, not on behaviour: an import cycle, a module over
``MAX_MODULE_LINES`` or a function over ``MAX_FUNCTION_LINES`` fails here unless its docstring
gives the reason (a line starting ``Why this is long:``). Lazy imports inside functions count as
edges too: hiding a cycle in a function does not remove it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "energysweep"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
REASON = "Why this is long:"

# Top-level units of energysweep, bottom layer first. A unit imports only lower layers.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"util", "hw", "job"}),  # helpers, hardware, what a job is (its typed spec, keys)
    frozenset({"tables"}),  # every table's schema, the status vocabulary, atomic writes
    frozenset({"energy", "gpu_setting", "torchpp", "dist"}),  # energy sources; GPU setting
    # control; PyTorch TP/PP; rank setup
    frozenset({"measure", "validity"}),  # the window rule and monitor; trust checks
    frozenset({"backends", "scenarios", "aggregate", "sweep", "launch"}),
    # rank entry point; published results; report; the sweep's archive and exports
    frozenset({"run", "results", "figures", "archive"}),
)
# What each top-level unit may import (besides itself). Changing a row changes the architecture:
# update docs/architecture.md with it.
ALLOWED: dict[str, frozenset[str]] = {
    "util": frozenset(),
    "tables": frozenset({"job"}),
    "hw": frozenset(),
    "job": frozenset(),
    "energy": frozenset({"hw", "tables"}),
    "gpu_setting": frozenset({"hw", "job", "tables"}),
    "torchpp": frozenset({"job"}),
    "dist": frozenset({"job"}),
    "measure": frozenset({"dist", "energy", "gpu_setting", "hw", "job", "tables", "util"}),
    "validity": frozenset({"energy", "hw", "job", "tables", "util"}),
    "backends": frozenset({"dist", "energy", "hw", "job", "tables", "torchpp", "util"}),
    "scenarios": frozenset(
        {"dist", "energy", "gpu_setting", "hw", "job", "measure", "tables", "torchpp", "util"}
    ),
    "aggregate": frozenset({"job", "tables", "util"}),
    # hw: the emulated node's config section is checked when the workflow loads
    # (hw.emulated.node_config, pure).
    "sweep": frozenset({"hw", "job", "tables", "util"}),
    # hw: the launcher prepares an emulated GPU node's state for the job (hw.emulated);
    # gpu_setting: it sets the job's GPUs before the ranks start and puts them back after.
    "launch": frozenset({"gpu_setting", "hw", "job", "tables", "util"}),
    # No aggregate: a rank imports no aggregation code (measure.combine holds its part).
    "run": frozenset(
        {
            "backends",
            "dist",
            "energy",
            "hw",
            "job",
            "launch",
            "measure",
            "scenarios",
            "tables",
            "torchpp",
            "util",
            "validity",
        }
    ),  # fmt: skip
    "results": frozenset({"aggregate", "job", "tables", "util", "validity"}),
    "figures": frozenset({"aggregate", "job", "tables", "util"}),
    # The crate reads the published tables; the exports count windows with aggregate's rule.
    "archive": frozenset({"aggregate", "job", "tables"}),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _resolve(node: ast.ImportFrom, name: str, modules: dict[str, Path]) -> str | None:
    """The absolute module an ``ImportFrom`` names (relative imports resolved against ``name``)."""
    if node.level == 0:
        return node.module
    base = name.split(".")
    if not _is_package(name, modules):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_edges(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Every ``energysweep`` module each module imports, at any depth of its body."""
    modules = modules if modules is not None else _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, name, modules)
                if base is None:
                    continue
                targets = [base]
                targets += [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            for target in targets:
                # importing a.b.c also runs a.b's __init__: the nearest known module counts
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith(PACKAGE + "."):
                    edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_import_walker_sees_lazy_and_package_imports(tmp_path):
    pkg = tmp_path / PACKAGE / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / PACKAGE / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from energysweep.sub.leaf import X\n")
    (pkg / "leaf.py").write_text("def f():\n    from energysweep.sub import Y\n")
    modules = {
        f"{PACKAGE}": tmp_path / PACKAGE / "__init__.py",
        f"{PACKAGE}.sub": pkg / "__init__.py",
        f"{PACKAGE}.sub.leaf": pkg / "leaf.py",
    }
    edges = import_edges(modules)
    assert cycles(edges) == [[f"{PACKAGE}.sub", f"{PACKAGE}.sub.leaf"]]


def unit_of(module: str) -> str:
    """The top-level unit of a module: ``energysweep.job.spec`` -> ``job``."""
    return module.split(".")[1]


def disallowed_imports(edges: dict[str, set[str]], allowed: dict[str, frozenset[str]]) -> list[str]:
    """Every module-level edge between two units that ``allowed`` does not permit."""
    bad = []
    for a, targets in sorted(edges.items()):
        if a == PACKAGE:
            continue
        for b in sorted(targets):
            ua, ub = unit_of(a), unit_of(b)
            if ua != ub and ub not in allowed.get(ua, frozenset()):
                bad.append(f"{a} -> {b} ({ua} may import only {sorted(allowed.get(ua, ()))})")
    return bad


def test_every_unit_is_in_the_table_and_in_one_layer():
    units = {unit_of(m) for m in _modules() if m != PACKAGE}
    layered = [u for layer in LAYERS for u in layer]
    assert sorted(layered) == sorted(set(layered)), "a unit is in two layers"
    assert units == set(ALLOWED) == set(layered), (
        f"units without a row: {sorted(units - set(ALLOWED))}; "
        f"rows without a unit: {sorted(set(ALLOWED) - units)}; "
        f"not layered: {sorted(units - set(layered))}"
    )


def test_allowed_imports_point_down_the_layers():
    layer = {u: i for i, units in enumerate(LAYERS) for u in units}
    upward = [f"{a} -> {b}" for a, bs in ALLOWED.items() for b in bs if layer[b] >= layer[a]]
    assert not upward, f"allowed imports that do not point to a lower layer: {upward}"


def test_allowed_imports_checker_fails_on_a_forbidden_edge():
    edges = {
        "energysweep.tables.shards": {"energysweep.aggregate.points"},
        "energysweep.aggregate.points": {"energysweep.tables.shards"},
    }
    assert disallowed_imports(edges, ALLOWED) == [
        "energysweep.tables.shards -> energysweep.aggregate.points (tables may import only ['job'])"
    ]


# Edges the house took out (issue 28): the launcher sets GPUs through gpu_setting, not the
# rank-side measure; config checks live with the config (sweep), not in validity; the
# environment table's reader lives in tables, not measure.
FORBIDDEN = (("launch", "measure"), ("sweep", "validity"), ("aggregate", "measure"))


def test_forbidden_edges_stay_out_of_the_table():
    allowed_back = [f"{a} -> {b}" for a, b in FORBIDDEN if b in ALLOWED[a]]
    assert not allowed_back, f"the allowed-imports table lets these back in: {allowed_back}"


def test_packages_import_only_what_the_table_allows():
    bad = disallowed_imports(import_edges(), ALLOWED)
    assert not bad, "imports the layering forbids:\n" + "\n".join(bad)


def test_no_import_cycle_in_src():
    found = cycles(import_edges())
    assert not found, "import cycles in src/: " + "; ".join(" <-> ".join(c) for c in found)


def _has_reason(node) -> bool:
    doc = ast.get_docstring(node) or ""
    return any(line.strip().startswith(REASON) for line in doc.splitlines())


@pytest.mark.parametrize("name", sorted(_modules()))
def test_module_and_function_length(name):
    path = _modules()[name]
    tree = ast.parse(path.read_text(), str(path))
    too_long = []
    lines = path.read_text().count("\n")
    if lines > MAX_MODULE_LINES and not _has_reason(tree):
        too_long.append(f"module {name}: {lines} lines")
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES and not _has_reason(node):
                too_long.append(f"{name}.{node.name}: {length} lines")
    assert not too_long, (
        f"over {MAX_MODULE_LINES} lines per module / {MAX_FUNCTION_LINES} per function without "
        f"a '{REASON}' line in the docstring: {too_long}"
    )


def test_no_snakemake_import_in_src():
    offenders = [
        name
        for name, path in _modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and any(
            (a.name if isinstance(node, ast.Import) else node.module or "").startswith("snakemake")
            for a in node.names
        )
    ]
    assert not offenders, offenders


TRUTH = "energysweep.hw.emulated.truth"


def truth_readers(edges: dict[str, set[str]]) -> list[str]:
    """Modules outside the emulator (``energysweep.hw.emulated``) that import its ground truth."""
    inside = "energysweep.hw.emulated"
    return sorted(
        m for m, targets in edges.items() if TRUTH in targets and not m.startswith(inside)
    )


def test_only_the_emulator_imports_its_ground_truth():
    """hw/emulated/truth.py is for tests and the benchmark: a measurement that read the truth
    would agree with it by construction (the check hw/emulated/truth.py's docstring cites)."""
    edges = import_edges()
    assert TRUTH in edges
    assert truth_readers(edges) == []
    # The check sees a reader where there is one (lazy imports too).
    assert truth_readers({**edges, "energysweep.energy.nvml": {TRUTH}}) == [
        "energysweep.energy.nvml"
    ]
