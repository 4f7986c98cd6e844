"""The architecture as imports: the library (llm/paddle_alignment) never imports the entry scripts and trainers
above it, its packages stand on floors and import only from their own floor or below, its modules form no
import cycle, checkpoints/ never reads a trainer, a decoupled sampler loads no trainer, and the installed
distribution claims no top-level name but its own (`llm` belongs to a PyPI package)."""

import ast
import os
import runpy
import shutil
import subprocess
import sys
from unittest import mock

import pytest
import setuptools

from helpers import REPO_ROOT

LIBRARY = os.path.join(REPO_ROOT, "llm", "paddle_alignment")
# The library's floors from the ground up, each a set of its packages and top-level modules: a module imports
# only from its own floor or below. "" is the package itself (its __init__).
FLOORS = (
    {"", "watchdog", "cpu_runtime", "custom_ops", "chat_format", "chat_template", "deadline_workers", "experience", "tokens", "algos"},
    {"distributed"},
    {"models", "micro_batches", "fused_optimizer", "group_sharded", "offload", "optimizer_step", "pipeline_parallel", "stage_tensor_parallel", "update_metrics"},
    {"data"},
    {"rewards"},
    {"agents"},
    {"config"},
    {"rollout"},
    {"checkpoints", "split_training"},
    {"preference"},
)


def unit(module):
    """The package or top-level module of the library that `module` (paddle_alignment.x.y) belongs to."""
    return module.split(".")[1] if "." in module else ""


def floor(module):
    found = [level for level, units in enumerate(FLOORS) if unit(module) in units]
    return found[0] if found else None


def upward_imports(library=LIBRARY):
    """(module, what it imports) for each import of the library that reaches a higher floor, or a module that
    stands on no floor."""
    found = []
    for module, names in library_modules(library).items():
        if floor(module) is None:
            found.append((module, "stands on no floor"))
            continue
        for name in sorted(n for n in names if n.startswith("paddle_alignment")):
            if floor(name) is None or floor(name) > floor(module):
                found.append((module, name))
    return found


def trainer_reads(library=LIBRARY):
    """(file, line) of each place in checkpoints/ that names a trainer: a checkpoint takes what a trainer hands it
    (saving.RunState), never the trainer."""
    found = []
    folder = os.path.join(library, "checkpoints")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
            for node in ast.walk(tree):
                named = node.id if isinstance(node, ast.Name) else node.arg if isinstance(node, ast.arg) else None
                if named is not None and (named == "trainer" or named.endswith("_trainer")):
                    found.append((name, node.lineno))
    return found


def library_modules(library=LIBRARY):
    """{module name: the paddle_alignment modules it imports, anywhere in its body}."""
    graph = {}
    for folder, _, files in os.walk(library):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            module = os.path.relpath(path, os.path.dirname(library))[:-3].replace(os.sep, ".").removesuffix(".__init__")
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


def test_every_import_of_the_library_reaches_down_or_across_its_floor():
    assert upward_imports() == []


def test_checkpoints_never_read_a_trainer():
    assert trainer_reads() == []


@pytest.mark.parametrize(
    "path, planted",
    [
        ("tokens.py", "from paddle_alignment.rollout.engines import Rollout\n"),  # the ground reaching up
        ("data/raw.py", "from paddle_alignment.rewards import TargetError\n"),
        ("newcomer.py", "import paddle\n"),  # a module on no floor
    ],
)
def test_a_planted_upward_import_is_caught(tmp_path, path, planted):
    library = shutil.copytree(LIBRARY, tmp_path / "paddle_alignment", ignore=shutil.ignore_patterns("__pycache__"))
    with open(library / path, "a", encoding="utf-8") as f:
        f.write(planted)
    assert upward_imports(str(library)) != []


def test_a_checkpoint_function_taking_the_trainer_is_caught(tmp_path):
    library = shutil.copytree(LIBRARY, tmp_path / "paddle_alignment", ignore=shutil.ignore_patterns("__pycache__"))
    with open(library / "checkpoints" / "saving.py", "a", encoding="utf-8") as f:
        f.write("\n\ndef save_schedule(trainer):\n    return trainer.lr_scheduler.state_dict()\n")
    assert [name for name, _ in trainer_reads(str(library))] == ["saving.py", "saving.py"]


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
