"""Policy weights from the trainer to the samplers, through the file system, one file per version.

Version v is the policy after v RL steps. The trainer's rank 0 writes `policy-v{v}.safetensors` into the
rollout folder as a temp file and renames it into place, so a sampler that sees the name reads a complete file.
safetensors writes the tensors' bytes as they lie in memory, behind a JSON header: half the time of
paddle.save's pickle (2.6 against 5.5 ms for the demo's 1M-parameter policy, on the trainer's critical path).
Only the parameters that train travel: a LoRA policy's adapters, or the whole of a fully trained policy;
the samplers load the same base weights at start. Files older than the oldest version a request can
still name are removed.
"""

import os
import re
import time

import numpy as np
import paddle
from safetensors.numpy import load_file, save_file

WEIGHTS_FILE = re.compile(r"^policy-v(\d+)\.safetensors$")


def weights_path(folder, version):
    return os.path.join(folder, f"policy-v{version}.safetensors")


def trained_state(model):
    """The parameters of `model` that train (not stop_gradient), by state-dict name."""
    state = model.state_dict()
    trained = {name for name, param in model.named_parameters() if not param.stop_gradient}
    return {key: value for key, value in state.items() if key in trained}


def host_array(tensor):
    """`tensor`'s values as a NumPy array: a view of a CPU tensor's own memory (DLPack), else a copy in host
    memory (a GPU tensor; or bfloat16, which DLPack cannot share and NumPy holds as uint16, as set_value
    takes it back)."""
    tensor = tensor.detach()
    if tensor.place.is_cpu_place() and tensor.dtype != paddle.bfloat16:
        return np.from_dlpack(tensor)
    return tensor.numpy()


def publish(model, folder, version, keep):
    """Write version `version` of `model`'s trained weights (called by the rank that publishes), then remove
    the versions more than `keep` older."""
    path = weights_path(folder, version)
    tmp = os.path.join(folder, f".tmp-{os.path.basename(path)}")
    save_file({name: host_array(value) for name, value in trained_state(model).items()}, tmp)
    os.replace(tmp, path)
    for name in os.listdir(folder):
        match = WEIGHTS_FILE.match(name)
        if match and int(match.group(1)) < version - keep:
            os.remove(os.path.join(folder, name))


def remove_all(folder):
    """Remove every published version and temp file (a new run must not load an earlier run's weights)."""
    for name in os.listdir(folder):
        if WEIGHTS_FILE.match(name) or name.startswith(".tmp-policy-v"):
            os.remove(os.path.join(folder, name))


def wait_and_load(model, folder, version, timeout, alive):
    """Load version `version` into `model`, waiting up to `timeout` seconds for it to be published while
    `alive()` (the trainer still runs)."""
    path = weights_path(folder, version)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if not alive():
            raise RuntimeError(f"the trainer stopped before publishing policy version {version} ({path})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"policy version {version} was not published within {timeout:.0f} s ({path})")
        time.sleep(0.02)
    state = load_file(path)
    missing = set(state) - set(model.state_dict())
    if missing:
        raise KeyError(f"{path} holds weights the sampler's policy lacks: {sorted(missing)[:5]}")
    model.set_state_dict(state)
