"""The worker process of agents/tools.py: imports a tool function by its path and calls it (deadline_workers.py's
protocol). A tool that hangs is killed with its worker; one that raises answers with its error."""

import importlib

from paddle_alignment.deadline_workers import serve

_functions = {}


def function_at(path):
    """The function at "module:qualified.name", imported once per worker."""
    if path not in _functions:
        module, _, name = path.partition(":")
        target = importlib.import_module(module)
        for part in name.split("."):
            target = getattr(target, part)
        _functions[path] = target
    return _functions[path]


def handle(request):
    function = function_at(request["path"])
    return function.__name__ if request.get("check") else str(function(**request["arguments"]))


if __name__ == "__main__":
    serve(handle)
