"""The checks every argument group shares: a name in its registry, import paths, no negative numbers."""


def check_choices(args, choices):
    """Each key's value is a name in its registry."""
    for key, registry in choices.items():
        value = getattr(args, key)
        if value not in registry.names():
            raise ValueError(f"{key}={value!r} is not available; choose from {registry.names()}")


def check_import_paths(paths, key, form):
    """Each entry of the config's `key` is written `form` (module:name)."""
    for spec in paths:
        if spec.count(":") != 1 or not all(spec.split(":")):
            raise ValueError(f"{key}: {spec!r} is not {form}")


def check_non_negative(args, keys):
    for key in keys:
        if getattr(args, key) is not None and getattr(args, key) < 0:
            raise ValueError(f"{key} must be >= 0, got {getattr(args, key)}")
