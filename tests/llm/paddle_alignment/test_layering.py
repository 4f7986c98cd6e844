"""The architecture as imports: the library (llm/paddle_alignment) never imports the entry scripts and trainers
above it, its modules form no import cycle, a decoupled sampler loads no trainer, and the installed
distribution claims no top-level name but its own (`llm` belongs to a PyPI package)."""

import ast
import os
import runpy
import subprocess
import sys
from unittest import mock

import setuptools

from helpers import REPO_ROOT

LIBRARY = os.path.join(REPO_ROOT, "llm", "paddle_alignment")


def library_modules():
    """{module name: the paddle_alignment modules it imports, anywhere in its body}."""
    graph = {}
    for folder, _, files in os.walk(LIBRARY):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            module = os.path.relpath(path, os.path.dirname(LIBRARY))[:-3].replace(os.sep, ".").removesuffix(".__init__")
            graph[module] = imported_names(path)
    return graph


def imported_names(path):
    names = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_the_library_never_imports_the_scripts_above_it():
    upward = {module: sorted(n for n in names if n == "llm" or n.startswith("llm.")) for module, names in library_modules().items()}
    assert {module: names for module, names in upward.items() if names} == {}


def test_the_library_has_no_import_cycle():
    graph = library_modules()
    edges = {module: {n for n in names if n in graph and n != module} for module, names in graph.items()}
    # A package's __init__ importing its own submodules (registries filling themselves) is not a cycle back.
    edges = {m: {n for n in targets if not m.startswith(n + ".")} for m, targets in edges.items()}
    state, cycles = {}, []

    def visit(module, path):
        state[module] = "open"
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def modules_loaded_by(statement, prefix, cwd):
    """The modules named `prefix` or under it that `statement` loads in a fresh interpreter."""
    code = f"import sys\n{statement}\nprint(sorted(m for m in sys.modules if m == {prefix!r} or m.startswith({prefix!r} + '.')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=cwd)
    return result.stdout.strip().splitlines()[-1]


def test_a_sampler_process_loads_no_trainer():
    # From outside the repository, where only the installed paddle_alignment is importable.
    assert modules_loaded_by("import paddle_alignment.rollout.sampler", "llm", os.path.dirname(REPO_ROOT)) == "[]"


def test_the_reward_server_and_the_data_tools_load_no_paddle():
    # The reward server is a light process beside the trainer; the data tools run where no paddle is installed.
    for module in ("llm.alignment.ppo.reward_server", "llm.tools.gen_kk", "llm.tools.convert_gsm8k", "llm.tools.gen_arith"):
        assert modules_loaded_by(f"import {module}", "paddle", REPO_ROOT) == "[]", module


def test_the_distribution_installs_only_paddle_alignment():
    with mock.patch.object(setuptools, "setup") as setup:
        cwd = os.getcwd()
        os.chdir(REPO_ROOT)
        try:
            runpy.run_path("setup.py")
        finally:
            os.chdir(cwd)
    options = setup.call_args.kwargs
    assert {package.split(".")[0] for package in options["packages"]} == {"paddle_alignment"}
    assert options["package_dir"] == {"paddle_alignment": "llm/paddle_alignment"}
    assert "entry_points" not in options  # console scripts would name modules of the uninstalled llm/ tree
