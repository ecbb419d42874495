"""The layering of docs/architecture.md, checked on every import of every asyncrl module (ast, no import runs).

A unit is a whole top-level package or module of asyncrl (``buffer``, ``staleness``, ``modes``): no module is
a unit of its own, so a cycle between packages cannot hide behind one. Imports inside functions and under
``TYPE_CHECKING`` count: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import asyncrl

ROOT = Path(asyncrl.__file__).resolve().parent

LAYERS: list[set[str]] = [
    {"cli", "examples"},  # examples/: runnable scripts (agent harnesses) that may use any part
    {"testing"},  # test tooling shipped with the package: may use any part it tests
    {"app"},
    {"sim"},
    {"runtime"},
    {"controller"},
    {"rollout"},
    {"serve"},
    {"proxy"},
    {"trainer"},
    {"engine"},
    {"weight_sync"},
    {"envs", "rewards"},
    {"sandbox"},
    {"data"},
    {"buffer", "staleness"},
    {"metrics"},
    {"models", "torch_threads", "hub"},
    {"config", "types", "rle", "modes"},
]
"""Top to bottom, from DESIGN §6: a unit imports only units of its own layer or below."""

EXCEPTIONS = {
    (
        "asyncrl.models.sft",
        "data",
    ): "the SFT warm start trains on a task's samples (DESIGN §6 puts it in models/)",
    ("asyncrl.models.sft", "rewards"): "and scores its greedy answers with the task's reward",
    ("asyncrl.models.sft", "metrics"): "and shows its progress like every long loop",
    ("asyncrl.models.sft", "serve"): "and stops a chat-templated answer where rollouts do (PromptStops)",
}
"""(module, unit it may import although the layers forbid it): why."""


def unit_of(dotted: str) -> str | None:
    """The layering unit of ``asyncrl.x.y`` (None for the ``asyncrl`` package itself)."""
    parts = dotted.split(".")
    if parts[0] != "asyncrl" or len(parts) < 2:
        return None
    return parts[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(path: Path) -> bool:
    return path.is_dir() or path.with_suffix(".py").is_file()


def imports_of(path: Path) -> set[str]:
    """Every asyncrl module ``path`` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            base = node.module
            found.add(base)
            if base == "asyncrl":  # ``from asyncrl import staleness``: a module; ``__version__``: not
                found |= {f"asyncrl.{a.name}" for a in node.names if _is_module(ROOT / a.name)}
    return {name for name in found if name.startswith("asyncrl.")}


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(unit, imported unit) → the modules that import across that edge (``EXCEPTIONS`` included)."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        module = module_name(path)
        source = unit_of(module)
        for imported in imports_of(path):
            target = unit_of(imported)
            if source is not None and target is not None and target != source:
                edges[(source, target)].append(module)
    return edges


def layer_of(unit: str) -> int:
    for index, layer in enumerate(LAYERS):
        if unit in layer:
            return index
    raise AssertionError(
        f"asyncrl unit {unit!r} is in no layer of this test: add it (and to docs/architecture.md)"
    )


def layer_violations(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    """Every upward edge, naming the modules that import across it, less those ``EXCEPTIONS`` allow."""
    violations = []
    for (source, target), modules in sorted(edges.items()):
        unexcused = sorted({m for m in modules if (m, target) not in EXCEPTIONS})
        if unexcused and layer_of(target) < layer_of(source):
            violations.append(f"{source} -> {target} (in {', '.join(unexcused)})")
    return violations


def find_cycle(edges: dict[tuple[str, str], list[str]]) -> list[str] | None:
    """One cycle of the unit graph as a path (first unit repeated last), or None. Every edge counts, excepted
    ones too: an exception may cross a layer, never close a loop between packages."""
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
    state: dict[str, str] = {}

    def visit(unit: str, path: list[str]) -> list[str] | None:
        state[unit] = "open"
        for nxt in sorted(graph[unit]):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [unit, nxt] if nxt in path else path + [unit, nxt]
            if nxt not in state and (cycle := visit(nxt, path + [unit])):
                return cycle
        state[unit] = "done"
        return None

    for unit in sorted(graph):
        if unit not in state and (cycle := visit(unit, [])):
            return cycle
    return None


def test_every_import_goes_down_the_layers():
    assert layer_violations(import_edges()) == []


def test_no_import_cycle_between_top_level_units():
    assert find_cycle(import_edges()) is None


def test_a_unit_is_a_whole_package():
    """A module deep in a package belongs to it: ``config -> controller.modes`` is ``config -> controller``,
    so a pure-data module parked in a higher package closes a package cycle and fails the check above."""
    assert unit_of("asyncrl.controller.controller") == unit_of("asyncrl.controller.run_state") == "controller"
    assert unit_of("asyncrl.modes") == "modes"
    parked = {("config", "controller"): ["asyncrl.config.controller"], ("controller", "config"): ["x"]}
    assert find_cycle(parked) == ["config", "controller", "config"]


def test_the_layers_are_the_ones_the_docs_draw():
    """docs/architecture.md lists each layer, top to bottom, in its layering table."""
    docs = (ROOT.parent / "docs" / "architecture.md").read_text()
    table = docs[docs.index("<!-- layers -->") : docs.index("<!-- /layers -->")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| layer")]
    drawn = [{name.strip(" `/") for name in row.split("|")[2].split(",")} for row in rows]
    assert drawn == LAYERS


def test_the_checkers_report_an_upward_import_and_a_cycle():
    upward = {("controller", "runtime"): ["asyncrl.controller.training"], ("runtime", "controller"): ["x"]}
    assert layer_violations(upward) == ["controller -> runtime (in asyncrl.controller.training)"]
    assert find_cycle(upward) == ["controller", "runtime", "controller"]
    assert find_cycle({("a", "b"): [], ("b", "c"): [], ("c", "b"): []}) == ["b", "c", "b"]
    assert find_cycle({("a", "b"): [], ("a", "c"): [], ("b", "c"): []}) is None


def test_an_excepted_upward_import_still_closes_a_cycle():
    module, target = next(iter(EXCEPTIONS))
    source = unit_of(module)
    assert layer_violations({(source, target): [module]}) == []
    assert find_cycle({(source, target): [module], (target, source): ["y"]}) is not None


def test_a_training_run_imports_without_the_server_or_ray_libraries():
    """``asyncrl train`` on the inline runtime needs torch and transformers only: the lent GPU machine has no
    pydantic, FastAPI or Ray, and a run there once failed at import because a rollout module reached a helper
    through the OpenAI server's module (which imports pydantic)."""
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'pydantic', 'fastapi', 'starlette', 'uvicorn', 'ray'}:\n"
        "            raise ImportError(f'{name} is not needed to train')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import asyncrl.cli.train, asyncrl.app.train\n"
    )
    result = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_every_import_inside_a_function_names_something_that_exists():
    """A lazy import (inside a function, so ruff cannot see it fail) of an asyncrl or bench name resolves: a
    renamed function once left ``bench/long_tail.py`` importing a name that no longer existed, found only when
    the benchmark reached that stage."""
    checkout = ROOT.parent
    missing = []
    files = [*ROOT.rglob("*.py"), *(checkout / "bench").glob("*.py"), *(checkout / "scripts").glob("*.py")]
    for path in files:
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                    continue
                if node.module.split(".")[0] in {"asyncrl", "bench"}:
                    module = importlib.import_module(node.module)
                    missing += [
                        f"{path.relative_to(checkout)}: {node.module}.{alias.name}"
                        for alias in node.names
                        if not hasattr(module, alias.name)
                        and importlib.util.find_spec(f"{node.module}.{alias.name}") is None
                    ]
    assert not missing, missing


def test_test_module_basenames_are_unique():
    """pytest's default import mode keys a test module by its basename (no ``__init__.py`` here): a second
    ``test_x.py`` in another folder stops collection of the whole suite, which is how CI once failed in 29 s."""
    tests_root = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = defaultdict(list)
    for path in tests_root.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(tests_root)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}
