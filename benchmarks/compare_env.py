"""Run one benchmark command under several environments, interleaved (A, B, C, A, B, C, ...), on a machine
that others share: each run's figure is printed with the CPU time other processes took during it.

    python benchmarks/compare_env.py --rounds 5 \\
        --variant "before=PADDLE_ALIGNMENT_CPU_RUNTIME=off OMP_NUM_THREADS=1" \\
        --variant "after=" \\
        -- benchmarks/bench_grpo.py --random_model -- --max_dec_len 8 --min_dec_len 8

A variant is NAME=KEY=VALUE KEY=VALUE ...; an empty list runs the command in the current environment.
Each run prints its last stdout line, or with --grep the stdout lines matching that regular expression.
`busy_cores` is the other processes' CPU time during the run divided by its wall time (from /proc/stat,
Linux only): near 0 on an idle machine. `own_cores` is the run's own CPU time over its wall time (threads
that spin while they wait count too). The summary gives each variant's median and best of the last
number on the last line, and the runs with busy_cores below --idle.
"""

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time


def cpu_seconds_of_machine():
    """CPU seconds spent so far by every process of the machine (user + nice + system), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    return sum(int(v) for v in fields[1:4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(command, env, grep):
    machine, mine, started = cpu_seconds_of_machine(), children_cpu_seconds(), time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    own = children_cpu_seconds() - mine
    others = None
    if machine is not None:
        others = max(0.0, (cpu_seconds_of_machine() - machine) - own) / wall
    lines = result.stdout.strip().splitlines()
    shown = [line for line in lines if re.search(grep, line)] if grep else lines[-1:]
    numbers = re.findall(r"[-+]?\d+(?:\.\d+)?", lines[-1]) if lines else []
    return shown, (float(numbers[-1]) if numbers else None), others, own / wall


def parse_variant(text):
    name, _, assignments = text.partition("=")
    return name, dict(item.split("=", 1) for item in assignments.split())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", required=True, help="NAME=KEY=VALUE KEY=VALUE ...")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--grep", default=None, help="print the stdout lines matching this regular expression")
    parser.add_argument("--idle", type=float, default=0.3, help="busy_cores below which a run counts as idle")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="python script and its arguments, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    variants = [parse_variant(v) for v in args.variant]
    figures = {name: [] for name, _ in variants}
    for round_ in range(args.rounds):
        for name, assignments in variants:
            shown, figure, others, cores = run_once([sys.executable, *command], dict(os.environ, **assignments), args.grep)
            figures[name].append((figure, others))
            busy = "?" if others is None else f"{others:.2f}"
            print(f"[{round_ + 1}] {name} busy_cores={busy} own_cores={cores:.2f} | " + " | ".join(shown), flush=True)
    for name, runs in figures.items():
        values = [figure for figure, _ in runs if figure is not None]
        idle = [figure for figure, others in runs if figure is not None and others is not None and others < args.idle]
        summary = f"median {statistics.median(values):.1f} best {max(values):.1f}" if values else "no figure"
        print(f"{name}: {summary}; idle runs: {' '.join(f'{v:.1f}' for v in idle) or 'none'}")


if __name__ == "__main__":
    main()
