"""The worker process of `rewards/symbolic.py`: math-verify's parse and verify, one JSON line per request."""

import json
import logging
import sys


def parse_math(text):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return parse(f"${text}$", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None)


def serve():
    logging.disable(logging.WARNING)  # math-verify warns on every call that its own timeout is off
    from math_verify import verify

    parse_math("1")  # warm the parser before answering "ready"
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if request["op"] == "parse":
                result = bool(parse_math(request["text"]))
            else:
                reference, answer = parse_math(request["reference"]), parse_math(request["answer"])
                result = bool(reference and answer and verify(reference, answer, timeout_seconds=None))
            print(json.dumps({"result": result}), flush=True)
        except Exception as error:  # noqa: BLE001 - the parent raises it with the request's context
            print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)


if __name__ == "__main__":
    serve()
