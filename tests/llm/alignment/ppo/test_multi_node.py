"""More than one node: two `paddle.distributed.launch --master 127.0.0.1:PORT --nnodes 2 --rank 0|1` launches of
2 processes each on loopback stand for two nodes. A PP2 x DP2 GRPO run (each node one pipeline, the data
ranks across the nodes) equals the same run launched as 4 processes on one node, step for step; TP2 x DP2
trains too. A worker killed with SIGKILL (kill -9) after checkpoint-2 ends the job on both nodes with an
error naming the failed collective, and the same two commands then resume from checkpoint-2 and end on the
uninterrupted run's weights, bit for bit."""

import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import FROZEN_RUN, REPO_ROOT, RUN_PPO, launch_two_processes, overrides, weights
from test_parallel import step_metrics

TINY_CONFIG = os.path.join(REPO_ROOT, "config", "tiny", "grpo_argument.json")

pytestmark = pytest.mark.slow


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_nodes(argv, log_dir, script=RUN_PPO, timeout=600):
    """`script` launched as 2 nodes of 2 processes on loopback; (each node's exit code, seconds to the last
    exit, {global rank: worker log}); each launcher's own output is written to log_dir/launcher<N>.log."""
    master = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    started = time.monotonic()
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "paddle.distributed.launch", "--master", master, "--nnodes", "2", "--rank", str(node),
             "--nproc_per_node", "2", "--log_dir", str(log_dir / f"node{node}"), script, *argv],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=timeout)[0] for node in nodes]
    codes = [node.returncode for node in nodes]
    seconds = time.monotonic() - started
    for node, output in enumerate(outputs):
        (log_dir / f"launcher{node}.log").write_text(output)
    # Each launcher names its workers' logs by local rank; node N's are global ranks 2N and 2N + 1.
    logs = {2 * node + local: (log_dir / f"node{node}" / f"workerlog.{local}").read_text(errors="replace")
            for node in (0, 1) for local in (0, 1)}
    return codes, seconds, logs


def grpo_argv(world, output_dir, **changes):
    return [TINY_CONFIG, *overrides(world, str(output_dir), max_steps=4, save_steps=2, eval_steps=2, **changes)]


@pytest.fixture(scope="module")
def two_node_pipeline_run(tiny_world, tmp_path_factory):
    """An uninterrupted two-node PP2 x DP2 run of 4 steps: (output_dir, rank 0's step metrics)."""
    root = tmp_path_factory.mktemp("two_nodes")
    codes, _, logs = launch_nodes(grpo_argv(tiny_world, root / "out", pipeline_parallel_degree=2), root / "log")
    assert codes == [0, 0], {rank: log[-2000:] for rank, log in logs.items()}
    return root / "out", step_metrics(logs[0])


def test_two_node_pipeline_by_data_parallel_run_equals_one_node(tiny_world, two_node_pipeline_run, tmp_path):
    output_dir, metrics = two_node_pipeline_run
    assert len(metrics) == 4
    logs = launch_two_processes(TINY_CONFIG, grpo_argv(tiny_world, tmp_path / "out", pipeline_parallel_degree=2)[1:],
                                tmp_path / "log", processes=4)
    assert step_metrics(logs[0]) == metrics
    one_node, two_nodes = weights(tmp_path / "out" / "policy"), weights(output_dir / "policy")
    for name, value in one_node.items():
        np.testing.assert_array_equal(two_nodes[name], value, err_msg=name)


def test_two_node_tensor_by_data_parallel_run_trains(tiny_world, tmp_path):
    codes, _, logs = launch_nodes(grpo_argv(tiny_world, tmp_path / "out", tensor_parallel_degree=2), tmp_path / "log")
    assert codes == [0, 0], {rank: log[-2000:] for rank, log in logs.items()}
    assert len(step_metrics(logs[0])) == 4 and os.path.isdir(tmp_path / "out" / "policy")


def test_a_killed_worker_ends_the_job_on_both_nodes_and_the_rerun_resumes_exactly(tiny_world, two_node_pipeline_run, tmp_path):
    """Rank 3 (the second node's last stage) kills itself with SIGKILL once checkpoint-2 is written
    (tests/probes/frozen_run.py): within two minutes both launches end, the survivors naming the collective
    that failed and the RL step; rerunning the same commands resumes checkpoint-2 and ends as the uninterrupted
    run."""
    output_dir, _ = two_node_pipeline_run
    argv = grpo_argv(tiny_world, tmp_path / "out", pipeline_parallel_degree=2)
    codes, seconds, logs = launch_nodes(["kill-rank-3:2", *argv], tmp_path / "killed_log", script=FROZEN_RUN)
    assert codes[0] != 0 and codes[1] != 0 and seconds < 120, (codes, seconds)
    # The second node's launcher names the first of its workers to end: the killed one (code -9) or its peer.
    launcher = (tmp_path / "killed_log" / "launcher1.log").read_text()
    assert re.search(r"Container rank [01] status failed .* code (-9|1) log .*node1/workerlog\.[01]", launcher), launcher[-3000:]
    survivors = [logs[rank] for rank in (0, 1, 2)]
    assert any(re.search(r"collective failed after \d+ s .* over 4 ranks; after RL step 2", log) for log in survivors), [
        log[-2000:] for log in survivors
    ]
    codes, _, logs = launch_nodes(argv, tmp_path / "rerun_log")
    assert codes == [0, 0], {rank: log[-2000:] for rank, log in logs.items()}
    assert f"resumed from {tmp_path / 'out' / 'checkpoint-2'} at step 2" in logs[0]
    resumed, straight = weights(tmp_path / "out" / "policy"), weights(output_dir / "policy")
    for name, value in straight.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
