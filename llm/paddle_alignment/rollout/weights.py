"""Policy weights from the trainer to the samplers, through the file system, one file per version.

Version v is the policy after v RL steps. The trainer's rank 0 writes `policy-v{v}.safetensors` into the
rollout folder under a temp name and renames it into place, so a sampler that opens the name reads a
complete file. safetensors lays the tensors' bytes out behind a JSON header (dtype, shape, offsets), with
the version in its metadata. Only the parameters that train travel: a LoRA policy's adapters, or the whole
of a fully trained policy; the samplers load the same base weights at start.

A version older than the oldest one a request can still name has expired. Publishing reuses an expired
file: renamed to the temp name, its header's version and its tensors' bytes are overwritten in place, and
it is renamed to the new version's name. Its pages are already in memory, so this is a copy of the
tensors, not a new file's allocation: publishing is on the trainer's critical path. A sampler compares the version in the header before and
after it reads, so a file reused while it is read (which the request protocol rules out) stops the
sampler with an error instead of mixing two policies. The other expired files are removed.
"""

import hashlib
import json
import os
import re
import time

import numpy as np
import paddle
from safetensors.numpy import load, save_file

WEIGHTS_FILE = re.compile(r"^policy-v(\d+)\.safetensors$")
CHECK_PREFIX = "__sync_check__."  # arrays of the weight-sync check (sync_check.py) beside the weights
HEADER_SIZE_BYTES = 8  # safetensors: the JSON header's length, little-endian, then the header


def weights_path(folder, version):
    return os.path.join(folder, f"policy-v{version}.safetensors")


def temp_path(folder, version):
    return os.path.join(folder, f".tmp-policy-v{version}.safetensors")


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


def version_field(version):
    """The header's version, fixed-width so that every version's header has the same length."""
    return f"{version:012d}"


def layout_of(arrays):
    """A digest of the names, dtypes and shapes of `arrays`: files with the same one have the same header
    apart from the version, and the same byte offsets."""
    signature = [(name, array.dtype.str, array.shape) for name, array in arrays.items()]
    return hashlib.sha1(repr(signature).encode()).hexdigest()


def header_at(fd):
    """The parsed header of the safetensors file open as `fd`, and its raw bytes (which follow the length)."""
    length = int.from_bytes(os.pread(fd, HEADER_SIZE_BYTES, 0), "little")
    raw = os.pread(fd, length, HEADER_SIZE_BYTES)
    return json.loads(raw), raw


def published_versions(folder):
    return sorted(int(match.group(1)) for match in map(WEIGHTS_FILE.match, os.listdir(folder)) if match)


def publish(state, folder, version, keep, check=None):
    """Write version `version` of the policy's trained weights `state` (trained_state; whole tensors), with
    the arrays of `check` (sync_check.record) beside them, from the rank that publishes: into an expired
    file (older than `version - keep`) when one has their layout, else a new one; then remove the other
    expired versions."""
    arrays = {name: host_array(value) for name, value in state.items()}
    arrays |= {CHECK_PREFIX + name: value for name, value in (check or {}).items()}
    metadata = {"version": version_field(version), "layout": layout_of(arrays)}
    expired = [old for old in published_versions(folder) if old < version - keep]
    tmp = temp_path(folder, version)
    if not (expired and rewrite_expired(weights_path(folder, expired[-1]), tmp, arrays, metadata)):
        save_file(arrays, tmp, metadata=metadata)
    os.replace(tmp, weights_path(folder, version))
    for old in expired[:-1]:  # the last one became this version's file
        os.remove(weights_path(folder, old))


def rewrite_expired(path, tmp, arrays, metadata):
    """Move the expired file `path` to `tmp` and overwrite its version and tensors with `metadata`'s and
    `arrays`'; False (leaving `tmp` to be written anew) when its layout is not theirs."""
    os.replace(path, tmp)
    with open(tmp, "r+b") as f:
        header, raw = header_at(f.fileno())
        old = header.get("__metadata__", {})
        if old.get("layout") != metadata["layout"]:
            return False
        # The version first: a sampler that reads this file meanwhile sees it change (see read_version).
        stale, fresh = (f'"version":"{value}"'.encode() for value in (old["version"], metadata["version"]))
        write_at(f.fileno(), fresh, HEADER_SIZE_BYTES + raw.index(stale))
        start = HEADER_SIZE_BYTES + len(raw)
        for name, array in arrays.items():
            write_at(f.fileno(), np.ascontiguousarray(array), start + header[name]["data_offsets"][0])
    return True


def write_at(fd, data, offset):
    written = os.pwrite(fd, data, offset)
    if written != memoryview(data).nbytes:
        raise OSError(f"wrote {written} of {memoryview(data).nbytes} bytes at offset {offset} of a weights file")


def read_version(path, version):
    """The tensors of the file `path` of version `version`, whose header must name that version before and
    after the read (a publisher reuses only expired files; one reused while read would mix two policies)."""
    with open(path, "rb") as f:
        before, _ = header_at(f.fileno())
        data = f.read()
        after, _ = header_at(f.fileno())
    seen = {int(header["__metadata__"]["version"]) for header in (before, after)}
    if seen != {version}:
        raise RuntimeError(
            f"{path} was reused for policy version {max(seen)} while this sampler read version {version}: "
            "a sampler must not run more than max_staleness + 2 versions behind the trainer"
        )
    return load(data)


def remove_all(folder):
    """Remove every published version and temp file (a new run must not load an earlier run's weights)."""
    for name in os.listdir(folder):
        if WEIGHTS_FILE.match(name) or name.startswith(".tmp-policy-v"):
            os.remove(os.path.join(folder, name))


def wait_and_load(model, folder, version, timeout, alive):
    """Load version `version` into `model`, waiting up to `timeout` seconds for it to be published while
    `alive()` (the trainer still runs); returns the weights loaded (name -> array) and the weight-sync check's
    arrays published with them ({} if none)."""
    path = weights_path(folder, version)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if not alive():
            raise RuntimeError(f"the trainer stopped before publishing policy version {version} ({path})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"policy version {version} was not published within {timeout:.0f} s ({path})")
        time.sleep(0.02)
    state = read_version(path, version)
    check = {name[len(CHECK_PREFIX):]: state.pop(name) for name in list(state) if name.startswith(CHECK_PREFIX)}
    assign(model, state, path)
    return state, check


def assign(model, state, path):
    """Copy `state` into `model`'s tensors of the same state-dict names. Not `model.set_state_dict`: a model
    may override it with other names in mind (paddlenlp's LoRAModel passes the dict on to the model it wraps,
    whose names lack the wrapper's `model.` prefix, and Paddle skips every unknown name with a warning that
    LoRAModel silences), and this copy must not miss a tensor."""
    targets = model.state_dict()
    missing = sorted(set(state) - set(targets))
    if missing:
        raise KeyError(f"{path} holds weights the sampler's policy lacks: {missing[:5]}")
    wrong = [
        f"{name} {list(value.shape)} (the sampler's {list(targets[name].shape)})"
        for name, value in sorted(state.items()) if list(value.shape) != list(targets[name].shape)
    ]
    if wrong:  # checked before any tensor changes
        raise ValueError(f"{path} holds weights of other shapes than the sampler's policy: {'; '.join(wrong[:5])}")
    for name, value in state.items():
        targets[name].set_value(value)
