"""The `paddlenlp_ops` package built from csrc/ (rollout ops and fused model kernels), looked up once per
set of ops: callers run Paddle's own ops instead when it is missing or lacks theirs, and say so once."""

import logging
from functools import lru_cache

logger = logging.getLogger(__name__)


@lru_cache(maxsize=None)
def paddlenlp_ops_with(names, instead):
    """The `paddlenlp_ops` module when it provides every op in `names` (a tuple), else None, with one
    warning that says what runs `instead`."""
    try:
        import paddlenlp_ops
    except ImportError:
        logger.warning(f"paddlenlp_ops is not installed: {instead}; build csrc/ (python csrc/setup_cpu.py install)")
        return None
    missing = [name for name in names if not hasattr(paddlenlp_ops, name)]
    if missing:
        where = getattr(paddlenlp_ops, "__file__", None) or "a namespace package"
        logger.warning(f"the installed paddlenlp_ops ({where}) lacks {missing}: {instead}")
        return None
    return paddlenlp_ops
