"""The README and docs stay true: every relative link resolves, every command names files that exist, flags
its script accepts and config keys that parse, the README stays short, CI runs the README's test command,
and the configuration reference is the one the code generates."""

import functools
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from helpers import REPO_ROOT
from llm.alignment.dpo.run_dpo import ARGUMENT_CLASSES as DPO_ARGUMENTS
from llm.alignment.kto.run_kto import ARGUMENT_CLASSES as KTO_ARGUMENTS
from llm.alignment.rm.run_reward import ARGUMENT_CLASSES as REWARD_ARGUMENTS
from llm.run_finetune import ARGUMENT_CLASSES as FINETUNE_ARGUMENTS
from llm.tools import config_reference
from paddle_alignment.config.arguments import ARGUMENT_CLASSES
from paddle_alignment.config.paddlenlp_keys import ALIASES, NO_EFFECT

PAGES = sorted(
    os.path.relpath(path, REPO_ROOT)
    for pattern in ("README.md", "docs/*.md", "benchmarks/RESULTS.md", "tests/README.md", "csrc/README.md")
    for path in glob.glob(os.path.join(REPO_ROOT, pattern))
)
REPO_DIRS = ("config/", "llm/", "benchmarks/", "csrc/", "tests/", "docs/")
CONFIG_SCRIPTS = {
    "llm/alignment/ppo/run_ppo.py": ARGUMENT_CLASSES,
    "llm/alignment/rm/run_reward.py": REWARD_ARGUMENTS,
    "llm/alignment/dpo/run_dpo.py": DPO_ARGUMENTS,
    "llm/alignment/kto/run_kto.py": KTO_ARGUMENTS,
    "llm/run_finetune.py": FINETUNE_ARGUMENTS,
}
# Options of paddle.distributed.launch that take a value, before the script it launches.
LAUNCH_OPTIONS_WITH_VALUE = ("--devices", "--nproc_per_node", "--log_dir", "--master", "--nnodes", "--gpus")


def read(page):
    return open(os.path.join(REPO_ROOT, page), encoding="utf-8").read()


def shell_blocks(text):
    return re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S)


def commands(page):
    """Each command of the page's shell blocks as a list of words (continuations joined, comments dropped,
    `&&`, `;`, `|` and `&` split)."""
    found = []
    for block in shell_blocks(read(page)):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            current = []
            for word in words + [";"]:
                if word in ("&&", ";", "|", "&", "||"):
                    if current:
                        found.append(current)
                    current = []
                else:
                    current.append(word.rstrip("&;"))  # `cmd &` at a line's end
    return found


def python_invocation(words):
    """(script path or "-m module", the arguments after it) of a `python ...` command, else None."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words = words[1:]  # environment assignments
    if not words or words[0] != "python":
        return None  # not python, or another environment's interpreter (TRL's venv): paths are still checked
    rest = words[1:]
    if rest[:2] == ["-m", "paddle.distributed.launch"]:
        rest = rest[2:]
        while rest and rest[0].startswith("--"):
            rest = rest[2:] if rest[0] in LAUNCH_OPTIONS_WITH_VALUE else rest[1:]
    if rest[:1] == ["-m"]:
        return "-m " + rest[1], rest[2:]
    return (rest[0], rest[1:]) if rest else None


def all_commands():
    return [(page, words) for page in PAGES for words in commands(page)]


@functools.lru_cache(maxsize=None)
def help_text(target):
    command = [sys.executable, *target.split()] + ["--help"]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stderr[-2000:]}"
    return result.stdout


def flags_before_separator(arguments):
    flags = []
    for word in arguments:
        if word == "--":
            break
        if word.startswith("--"):
            flags.append(word.split("=")[0])
    return flags


def test_the_readme_stays_short():
    assert len(read("README.md").splitlines()) <= 300


# A dated or timed figure: a date, a duration in (milli/micro)seconds, a rate; in the code, a speed-up too.
TIMED = r"20\d\d-\d\d-\d\d|\b\d+(\.\d+)? ?(ms|us|µs)\b|\b\d+\.\d+ ?s\b|GFLOP/s|GB/s"
MEASURED = {"README.md": re.compile(TIMED), "code": re.compile(TIMED + r"|\b\d+(\.\d+)?x (faster|slower)\b")}
SOURCES = ("llm/**/*.py", "csrc/*.cc", "csrc/**/*.h", "csrc/**/*.cuh")


def test_dated_and_measured_figures_live_in_results_not_in_the_code_or_the_readme():
    """Figures belong to benchmarks/RESULTS.md (and the docs page that owns them), dated there once: code
    comments say why, and the README states a claim with at most one undated figure, linking to them."""
    found = [
        f"{os.path.relpath(path, REPO_ROOT)}:{number}: {line.strip()}"
        for pattern in SOURCES + ("README.md",)
        for path in glob.glob(os.path.join(REPO_ROOT, pattern), recursive=True)
        for number, line in enumerate(open(path, encoding="utf-8"), start=1)
        if MEASURED.get(pattern, MEASURED["code"]).search(line)
    ]
    assert found == []


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", read(page)):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = os.path.normpath(os.path.join(REPO_ROOT, os.path.dirname(page), target.split("#")[0]))
        if not os.path.exists(path):
            broken.append(target)
    assert broken == []


def test_every_doc_page_is_linked_from_the_readme():
    readme = read("README.md")
    assert [page for page in glob.glob(os.path.join(REPO_ROOT, "docs", "*.md"))
            if f"docs/{os.path.basename(page)}" not in readme] == []


def test_every_path_a_command_names_exists():
    missing = []
    for page, words in all_commands():
        for word in words:
            for path in re.findall(r"(?:^|[\s=])((?:%s)[\w./-]+)" % "|".join(map(re.escape, REPO_DIRS)), " " + word):
                if not any(ch in path for ch in "*<>{}") and not os.path.exists(os.path.join(REPO_ROOT, path.rstrip("."))):
                    missing.append(f"{page}: {path}")
    assert missing == []


def test_every_config_command_sets_known_keys():
    unknown = []
    for page, words in all_commands():
        invocation = python_invocation(words)
        if invocation is None or invocation[0] not in CONFIG_SCRIPTS:
            continue
        script, arguments = invocation
        valid = {f.name for cls in CONFIG_SCRIPTS[script] for f in cls.__dataclass_fields__.values()} | set(ALIASES) | set(NO_EFFECT)
        assert arguments and arguments[0].endswith((".json", ".yaml", ".yml")), f"{page}: {' '.join(words)}"
        unknown += [f"{page}: {flag}" for flag in flags_before_separator(arguments[1:]) if flag[2:] not in valid]
    assert unknown == []


def argparse_invocations():
    seen = {}
    for page, words in all_commands():
        invocation = python_invocation(words)
        if invocation is None or invocation[0] in CONFIG_SCRIPTS or "setup_c" in invocation[0]:
            continue
        if invocation[0].startswith("-m ") and not invocation[0].startswith(("-m llm.", "-m paddle_alignment.")):
            continue  # another project's module (pytest, venv)
        seen.setdefault(invocation[0], set()).update(f"{page}: {flag}" for flag in flags_before_separator(invocation[1]))
    return sorted(seen.items())


@pytest.mark.parametrize("target, flags", argparse_invocations(), ids=lambda value: value if isinstance(value, str) else "")
def test_every_other_command_uses_flags_its_script_accepts(target, flags):
    text = help_text(target)
    assert [flag for flag in sorted(flags) if flag.split(": ")[1] not in text] == []


def test_ci_runs_the_readme_test_command():
    readme_command = next(line for block in shell_blocks(read("README.md")) for line in block.splitlines()
                          if "python -m pytest" in line)
    assert readme_command.strip() in read(".ci/run")


def test_the_configuration_reference_is_generated_from_the_code():
    assert read("docs/configuration.md") == config_reference.reference(), (
        "docs/configuration.md is out of date: python -m llm.tools.config_reference"
    )
