"""The worker process of `rewards/symbolic.py`: math-verify's parse and verify (deadline_workers.py's protocol)."""

import logging

from paddle_alignment.deadline_workers import serve


def parse_math(text):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return parse(f"${text}$", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None)


def handle(request):
    from math_verify import verify

    if request["op"] == "parse":
        return bool(parse_math(request["text"]))
    reference, answer = parse_math(request["reference"]), parse_math(request["answer"])
    return bool(reference and answer and verify(reference, answer, timeout_seconds=None))


if __name__ == "__main__":
    logging.disable(logging.WARNING)  # math-verify warns on every call that its own timeout is off
    serve(handle, warm=lambda: parse_math("1"))  # the parser warm before answering "ready"
