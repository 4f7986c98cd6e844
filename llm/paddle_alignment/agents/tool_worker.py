"""The worker process of agents/tools.py and agents/environments.py (deadline_workers.py's protocol): calls a
tool function by its path, or resets and steps an environment whose instance travels pickled. A call that hangs
is killed with its worker; one that raises answers with its error."""

from paddle_alignment.agents.environments import checked_step, pickled, unpickled
from paddle_alignment.agents.tools import import_path
from paddle_alignment.deadline_workers import serve

_objects = {}


def object_at(path):
    """The function or class at "module:qualified.name", imported once per worker."""
    if path not in _objects:
        _objects[path] = import_path(path)
    return _objects[path]


def environment_call(request):
    cls = object_at(request["environment"])
    if request["op"] == "check":
        return cls.__name__
    if request["op"] == "reset":
        environment = cls()
        environment.reset(request["row"])
        return {"state": pickled(environment)}
    environment = unpickled(request["state"])
    result = checked_step(environment.step(request["action"]), cls.__name__)
    return {"state": pickled(environment), **result}


def handle(request):
    if "environment" in request:
        return environment_call(request)
    function = object_at(request["path"])
    return function.__name__ if request.get("check") else str(function(**request["arguments"]))


if __name__ == "__main__":
    serve(handle)
