"""PaddleNLP's layout keeps the score models under rm/models. Here they live in the library
(llm/paddle_alignment/models), and this package names those same modules: `llm.alignment.rm.models.score_model` is
`paddle_alignment.models.score_model`, one module loaded once (a symlinked folder would load the files
twice, as two modules with two registries)."""

import sys

from paddle_alignment.models import score_model, score_model_utils

for _module in (score_model, score_model_utils):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
