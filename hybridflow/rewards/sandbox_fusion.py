"""Code runs in a SandboxFusion service instead of the local sandbox: veRL's ``reward.sandbox_fusion``.

SandboxFusion (bytedance/SandboxFusion) executes code posted to ``POST <url>`` (its ``/run_code`` endpoint)
as ``{"code", "language", "stdin", "run_timeout", "compile_timeout", "memory_limit_MB", "files",
"fetch_files"}`` and answers ``{"status": "Success" | "Failed" | "SandboxError", "run_result": {"status":
"Finished" | "TimeLimitExceeded" | "Error", "stdout", "stderr", "return_code", "execution_time"},
"compile_result": ...}``. ``run_remote`` turns that answer into the local sandbox's ``ExecResult`` (reason ok,
timeout, memory, error), so the code scorer grades a remote run exactly as a local one.

A service that cannot be reached, or answers with a server or sandbox error, is not the sample's fault:
``SandboxServiceError`` names the URL (the reward manager then names the sample; ``reward.bad_sample_score``
decides whether the step goes on). veRL scores such a test as failed, which trains on zero rewards while the
service is down. Gateway errors and refused connections are retried (3 attempts, 1 s then 2 s apart).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from hybridflow.rewards.sandbox import ExecResult, Limits
from hybridflow.rewards.sandbox_child import call_fn_source

__all__ = ["SandboxServiceError", "remote_program", "run_remote", "shared_semaphore"]

REMOTE_RESULT_MARKER = "<hybridflow-result>"  # printable: the service's stdout passes through JSON and logs
_RETRIED_STATUS = (502, 503, 504)
_ATTEMPTS = 3
_SEMAPHORES: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_SEMAPHORES_LOCK = threading.Lock()


class SandboxServiceError(RuntimeError):
    """The SandboxFusion service could not run the code (unreachable, an HTTP error, its own SandboxError)."""


def shared_semaphore(url: str, max_concurrent: int) -> threading.BoundedSemaphore:
    """One limit of requests in flight per service and process (``reward.sandbox_fusion.max_concurrent``)."""
    if int(max_concurrent) < 1:
        raise ValueError(f"reward.sandbox_fusion.max_concurrent={max_concurrent} must be >= 1")
    with _SEMAPHORES_LOCK:
        return _SEMAPHORES.setdefault((url, int(max_concurrent)), threading.BoundedSemaphore(int(max_concurrent)))


def remote_program(code: str, fn_name: str | None) -> str:
    """What the service runs: the code itself, or (call tests) the code in fresh globals followed by the call of
    ``fn_name`` on the JSON arguments read from stdin, its return value printed after the result marker, as
    the local sandbox's child does."""
    if not fn_name:
        return code
    return (
        "import builtins, json, sys\n"
        f"_source = {code!r}\n"
        f"_fn_name = {fn_name!r}\n"
        "_call_args = json.loads(sys.stdin.read())\n"
        "sys.argv = ['solution.py']\n"
        "_globals = {'__name__': '__main__', '__builtins__': builtins, '__file__': 'solution.py'}\n"
        "exec(compile(_source, 'solution.py', 'exec'), _globals)\n" + call_fn_source(REMOTE_RESULT_MARKER)
    )


def _post(url: str, payload: dict, timeout_s: float) -> dict:
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    last = ""
    for attempt in range(_ATTEMPTS):
        if attempt:
            time.sleep(attempt)  # 1 s, then 2 s
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                text = response.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code} {e.reason}"
            if e.code in _RETRIED_STATUS:
                continue
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            continue
        try:
            answer = json.loads(text)
        except json.JSONDecodeError:
            where = f"reward.sandbox_fusion.url={url}"
            raise SandboxServiceError(f"{where} answered with no JSON: {text[:200]!r}") from None
        if not isinstance(answer, dict):
            raise SandboxServiceError(f"reward.sandbox_fusion.url={url} answered {answer!r}, not a JSON object")
        return answer
    raise SandboxServiceError(f"reward.sandbox_fusion.url={url}: no answer after {attempt + 1} attempt(s) ({last})")


def _reason(answer: dict, url: str) -> str:
    status = answer.get("status")
    run = answer.get("run_result") or {}
    compile_result = answer.get("compile_result") or {}
    if status == "Success" and run.get("status") == "Finished":
        return "ok"
    if status != "Failed":
        message = answer.get("message") or answer.get("detail") or ""
        raise SandboxServiceError(f"reward.sandbox_fusion.url={url} answered status={status!r} {message}".rstrip())
    if compile_result.get("status") not in (None, "Finished") or compile_result.get("return_code") not in (None, 0):
        return "error"  # the code did not compile
    if run.get("status") == "TimeLimitExceeded":
        return "timeout"
    if "MemoryError" in str(run.get("stderr") or ""):
        return "memory"
    return "error"


def run_remote(
    url: str,
    code: str,
    stdin: str = "",
    limits: Limits | None = None,
    fn_name: str | None = None,
    call_args: list | None = None,
    semaphore: Any = None,
) -> ExecResult:
    """Run Python ``code`` once in the service at ``url``; with ``fn_name`` also call it on ``call_args``. The
    run's limits are ``limits.timeout_s`` and ``limits.memory_mb``; ``semaphore`` (a context manager) bounds the
    requests in flight."""
    limits = limits or Limits()
    if fn_name:
        stdin = json.dumps(list(call_args or []))
    payload = {
        "code": remote_program(code, fn_name),
        "language": "python",
        "stdin": stdin,
        "run_timeout": limits.timeout_s,
        "compile_timeout": limits.timeout_s,
        "memory_limit_MB": int(limits.memory_mb),
        "files": {},
        "fetch_files": [],
    }
    start = time.monotonic()
    with semaphore if semaphore is not None else contextlib.nullcontext():
        answer = _post(url, payload, 2 * limits.timeout_s + 10)
    reason = _reason(answer, url)
    run = answer.get("run_result") or {}
    stdout, stderr = str(run.get("stdout") or ""), str(run.get("stderr") or "")
    result_json = None
    if fn_name and REMOTE_RESULT_MARKER in stdout:
        stdout, _, tail = stdout.rpartition(REMOTE_RESULT_MARKER)
        result_json = tail.strip()
    code_returned = run.get("return_code")
    return ExecResult(stdout, stderr, code_returned, reason, time.monotonic() - start, result_json)
