"""Code scorer: run the response's Python against test cases; the score is the fraction passed.

``ground_truth`` (a dict or its JSON string) is ``{"inputs": [...], "outputs": [...]}`` for stdin/stdout
tests, or with ``"fn_name"`` for call tests (each input a list of arguments, each output the return
value). APPS-style ``{"input_output": "<json>"}`` is unwrapped. Every test runs in its own sandboxed
process (see ``hybridflow.rewards.sandbox``); the result says which isolation was in force.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import math
import re
from typing import Any

from hybridflow.rewards.sandbox import Limits, isolation, run_python
from hybridflow.rewards.sandbox_fusion import run_remote

__all__ = ["extract_code", "parse_tests", "outputs_match", "compute_score"]

_FENCE = re.compile(r"```([\w+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3"}


def extract_code(solution_str: str) -> str:
    """The last ```python block, else the last untagged fenced block, else the whole text."""
    blocks = _FENCE.findall(solution_str)
    python = [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS]
    if python:
        return python[-1]
    plain = [body for tag, body in blocks if not tag]
    return plain[-1] if plain else solution_str


def parse_tests(ground_truth: Any) -> dict:
    """Normalise the test spec to {"inputs": list, "outputs": list, "fn_name": str | None}."""
    spec = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else dict(ground_truth)
    if "inputs" not in spec and "input_output" in spec:
        inner = spec["input_output"]
        spec = json.loads(inner) if isinstance(inner, (str, bytes)) else dict(inner)
    inputs, outputs = list(spec.get("inputs", [])), list(spec.get("outputs", []))
    if not inputs or len(inputs) != len(outputs):
        raise ValueError(
            "code ground_truth needs equally long non-empty 'inputs' and 'outputs'; "
            f"got {len(inputs)} and {len(outputs)}"
        )
    return {"inputs": inputs, "outputs": outputs, "fn_name": spec.get("fn_name") or None}


def _as_text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _same_token(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return math.isfinite(x) and math.isfinite(y) and math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6)


def outputs_match(actual: str, expected: Any) -> bool:
    """Whitespace-insensitive comparison by tokens; numbers compare with 1e-6 tolerance."""
    got, want = actual.split(), _as_text(expected).split()
    return len(got) == len(want) and all(_same_token(a, b) for a, b in zip(got, want))


def _call_args(test_input: Any) -> list:
    if isinstance(test_input, str):
        try:
            test_input = json.loads(test_input)
        except json.JSONDecodeError:
            return [test_input]
    return list(test_input) if isinstance(test_input, list) else [test_input]


def _returned_match(result_json: str | None, expected: Any) -> bool:
    if result_json is None:
        return False
    got = json.loads(result_json)
    want = json.loads(json.dumps(expected))  # tuples -> lists, as the child's JSON has them
    # APPS wraps a single return value in a list.
    return got == want or (isinstance(want, list) and len(want) == 1 and got == want[0])


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    max_processes: int = 4,
    stop_on_timeout: bool = False,
    sandbox_fusion_url: str | None = None,
    concurrent_semaphore: Any = None,
) -> dict:
    """{"score": passed / total, "passed", "total", "reason", "isolation"}.

    ``reason`` is "passed" when all pass, else the first failure's: wrong_answer, timeout, memory,
    error. ``stop_on_timeout`` counts the tests after a timeout as failed. ``sandbox_fusion_url``: the tests
    run in that SandboxFusion service (``reward.sandbox_fusion``; at most ``concurrent_semaphore``'s count of
    them at once), graded as local runs are.
    """
    tests = parse_tests(ground_truth)
    limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb, max_processes=max_processes)
    code = extract_code(solution_str)
    cases = list(zip(tests["inputs"], tests["outputs"]))
    if sandbox_fusion_url:
        run_one = functools.partial(run_remote, sandbox_fusion_url, limits=limits, semaphore=concurrent_semaphore)
        where = f"SandboxFusion service {sandbox_fusion_url}"
    else:
        run_one, where = functools.partial(run_python, limits=limits), isolation(limits)

    def run(case):
        test_input, expected = case
        if tests["fn_name"]:
            result = run_one(code, fn_name=tests["fn_name"], call_args=_call_args(test_input))
            return result, result.reason == "ok" and _returned_match(result.result_json, expected)
        result = run_one(code, stdin=_as_text(test_input))
        return result, result.reason == "ok" and outputs_match(result.stdout, expected)

    if sandbox_fusion_url:  # remote runs wait on the network: send them together
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(cases), 16)) as pool:
            outcomes = list(pool.map(run, cases))
    else:
        outcomes = (run(case) for case in cases)  # lazily: after a timeout with stop_on_timeout, none runs
    total, passed, first_failure = len(cases), 0, None
    for result, ok in outcomes:
        if ok:
            passed += 1
        elif first_failure is None:
            first_failure = "wrong_answer" if result.reason == "ok" else result.reason
        if result.reason == "timeout" and stop_on_timeout:
            break
    return {
        "score": passed / total,
        "passed": passed,
        "total": total,
        "reason": first_failure or "passed",
        "isolation": where,
    }
