"""The `paddlenlp_ops` package built from csrc/ (rollout ops and fused model kernels), looked up once per
set of ops: callers run Paddle's own ops instead when it is missing or lacks theirs, and say so once."""

import logging
from functools import lru_cache

from paddle_alignment.cpu_runtime import MKL_LIBRARY, paddle_library

logger = logging.getLogger(__name__)

# The ops whose matrix products run in Paddle's own MKL (csrc/common/mkl_gemm.h), which a Paddle build without MKL
# (built with WITH_MKL=OFF, as for ARM CPUs) does not have; the other CPU ops run there, their loops on one thread.
MKL_OPS = frozenset({"fused_attention", "native_decoder_forward", "native_packed_products"})


@lru_cache(maxsize=None)
def paddlenlp_ops_with(names, instead):
    """The `paddlenlp_ops` module when it provides every op in `names` (a tuple) and Paddle has the MKL those of
    MKL_OPS compute with, else None, with one warning that says what runs `instead`."""
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
    needing_mkl = sorted(MKL_OPS.intersection(names))
    if needing_mkl and paddle_library(MKL_LIBRARY) is None:
        logger.warning(f"this Paddle build has no MKL ({MKL_LIBRARY}), which {needing_mkl} compute with: {instead}")
        return None
    return paddlenlp_ops
