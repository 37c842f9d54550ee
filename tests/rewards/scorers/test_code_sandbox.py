"""Code scorer and its sandbox: scores, failure reasons, and that each escape route is closed.

Every escape test is written so that it would pass the other way round without isolation: a real
listening socket to connect to, a real env var in the parent, a real writable /tmp path.
"""

import json
import os
import socket
import threading
import uuid

import pytest

from hybridflow.rewards import sandbox
from hybridflow.rewards.scorers import code_sandbox

FAST = dict(timeout_s=2.0, memory_mb=256)
DOUBLE = json.dumps({"inputs": ["1\n", "2\n", "5\n"], "outputs": ["2\n", "4\n", "10\n"]})
LIMITS = sandbox.Limits(timeout_s=2.0, memory_mb=256)


def fenced(code):
    return f"Here is my solution:\n```python\n{code}\n```\nDone."


def test_correct_solution_scores_one():
    result = code_sandbox.compute_score(fenced("print(int(input()) * 2)"), DOUBLE, **FAST)
    assert result["score"] == 1.0 and result["passed"] == 3 and result["total"] == 3
    assert result["reason"] == "passed"
    assert "rlimits" in result["isolation"]


def test_partially_correct_scores_fraction():
    # right for 1 and 2 (2, 4) but 5 -> 9 instead of 10: 2 of 3 tests pass
    code = "n = int(input())\nprint(n * 2 if n < 3 else n * 2 - 1)"
    result = code_sandbox.compute_score(fenced(code), dict(json.loads(DOUBLE)), **FAST)
    assert result["score"] == pytest.approx(2 / 3)
    assert result["passed"] == 2 and result["reason"] == "wrong_answer"


def test_runtime_error_and_no_code():
    one = json.dumps({"inputs": ["1\n"], "outputs": ["2\n"]})
    assert code_sandbox.compute_score(fenced("raise SystemExit(3)"), one, **FAST)["reason"] == "error"
    result = code_sandbox.compute_score("I don't know.", one, **FAST)  # whole text runs: a SyntaxError
    assert result["score"] == 0.0 and result["reason"] == "error"


def test_infinite_loop_times_out():
    truth = json.dumps({"inputs": [""], "outputs": ["1"]})
    result = code_sandbox.compute_score(fenced("while True:\n    pass"), truth, timeout_s=0.5, memory_mb=256)
    assert result["score"] == 0.0 and result["reason"] == "timeout"


@pytest.mark.parametrize("bomb", ["x = bytearray(10**10)", "a = []\nwhile True:\n    a.append(bytearray(10**7))"])
def test_memory_bomb(bomb):
    truth = json.dumps({"inputs": [""], "outputs": ["1"]})
    result = code_sandbox.compute_score(fenced(bomb), truth, timeout_s=2.0, memory_mb=128)
    assert result["score"] == 0.0 and result["reason"] == "memory"


def test_fork_bomb_is_refused_by_the_hook():
    run = sandbox.run_python("import os\nwhile True:\n    os.fork()", limits=LIMITS)
    assert run.reason == "error" and "os.fork is not allowed" in run.stderr
    run = sandbox.run_python("import subprocess\nsubprocess.run(['id'])", limits=LIMITS)
    assert run.reason == "error" and "not allowed" in run.stderr


def test_fork_bomb_is_bounded_by_rlimit_nproc_without_the_hook():
    if os.geteuid() == 0 and not sandbox.kernel_layers()["drop_uid"]:
        pytest.skip("root without a per-run uid: RLIMIT_NPROC would not apply; only the hook contains forks")
    code = (
        "import os\nn = 0\ntry:\n    while True:\n        os.fork(); n += 1\nexcept OSError:\n    pass\n"
        "print('alive', flush=True)\nos._exit(0)"
    )
    run = sandbox.run_python(
        code, limits=sandbox.Limits(timeout_s=2.0, memory_mb=256, max_processes=4), audit_hook=False
    )
    # every process of the tree prints once: at most max_processes of them could exist
    assert 1 <= run.stdout.count("alive") <= 4


def _write_outside(path):
    return (
        f"try:\n    open({path!r}, 'w').write('x')\n    print('WROTE')\n"
        "except OSError as e:\n    print('DENIED', type(e).__name__)"
    )


@pytest.mark.parametrize("hook", [True, False])
def test_writing_outside_the_directory_fails(hook):
    if not hook and not sandbox.kernel_layers()["readonly_fs"]:
        pytest.skip("no read-only mount namespace here; the audit hook is the only write barrier")
    target = f"/tmp/hf_escape_{uuid.uuid4().hex}"
    run = sandbox.run_python(
        _write_outside(target) + "\nopen('inside.txt', 'w').write('ok')\nprint('INSIDE')",
        limits=LIMITS,
        audit_hook=hook,
    )
    assert "DENIED" in run.stdout and "WROTE" not in run.stdout
    assert "INSIDE" in run.stdout  # the run's own directory stays writable
    assert not os.path.exists(target)


@pytest.fixture
def listening_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    server.close()


@pytest.mark.parametrize("hook", [True, False])
def test_network_is_unreachable(listening_port, hook):
    if not hook and not sandbox.kernel_layers()["netns"]:
        pytest.skip("no network namespace here; the audit hook is the only network barrier")
    port, accepted = listening_port
    code = (
        "import socket\ntry:\n    s = socket.socket(); s.settimeout(1)\n"
        f"    s.connect(('127.0.0.1', {port})); print('CONNECTED')\n"
        "except OSError as e:\n    print('DENIED', e)"
    )
    run = sandbox.run_python(code, limits=LIMITS, audit_hook=hook)
    assert "DENIED" in run.stdout and "CONNECTED" not in run.stdout
    assert accepted == []


def test_parent_environment_is_not_readable(monkeypatch):
    monkeypatch.setenv("HF_SECRET", "xyz-secret-123")
    code = (
        "import os\nprint(dict(os.environ))\n"
        "try:\n    print(open('/proc/%d/environ' % os.getppid()).read())\n"
        "except OSError as e:\n    print('DENIED', type(e).__name__)"
    )
    layers = sandbox.kernel_layers()
    # without the hook, only a per-run uid or a hidden /proc keeps /proc/<driver>/environ out of reach
    for hook in (True, False) if layers["drop_uid"] or layers["hide_proc"] else (True,):
        run = sandbox.run_python(code, limits=LIMITS, audit_hook=hook)
        assert "xyz-secret-123" not in run.stdout + run.stderr
        assert "HF_SECRET" not in run.stdout
    # and through the scorer: echoing the variable cannot earn the reward
    truth = json.dumps({"inputs": [""], "outputs": ["xyz-secret-123"]})
    echo = "import os\nprint(os.environ.get('HF_SECRET', 'none'))"
    assert code_sandbox.compute_score(fenced(echo), truth, **FAST)["score"] == 0.0


def test_call_based_tests_with_fn_name():
    truth = {"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [[3], 7]}  # APPS wraps some outputs
    assert code_sandbox.compute_score(fenced("def add(a, b):\n    return a + b"), truth, **FAST)["score"] == 1.0
    leetcode = "class Solution:\n    def add(self, a, b):\n        return a + b if a < 3 else 0"
    result = code_sandbox.compute_score(fenced(leetcode), truth, **FAST)
    assert result["score"] == 0.5 and result["reason"] == "wrong_answer"


EXTRACT = [
    ("```python\na=1\n```\n```python\nb=2\n```", "b=2\n"),  # the last python block
    ("```py\nc=3\n```", "c=3\n"),
    ("```\nd=4\n```", "d=4\n"),  # untagged block
    ("```python\ne=5\n```\n```text\nout\n```", "e=5\n"),  # a later non-python block is ignored
    ("print(6)", "print(6)"),  # no fence: the whole text
]


@pytest.mark.parametrize("text,expected", EXTRACT)
def test_extract_code(text, expected):
    assert code_sandbox.extract_code(text) == expected


MATCH = [
    ("1 2\n3\n", "1 2\n3", True),  # trailing whitespace and newlines ignored
    ("1  2 3", "1 2\n3", True),  # whitespace-insensitive tokens
    ("0.3333333", "0.33333334", True),  # within 1e-6
    ("0.33", "0.34", False),
    ("1 2", "1 2 3", False),
    ("yes", "Yes", False),  # case matters
    ("a\nb", ["a", "b"], True),  # expected given as a list of lines
]


@pytest.mark.parametrize("actual,expected,ok", MATCH)
def test_outputs_match(actual, expected, ok):
    assert code_sandbox.outputs_match(actual, expected) is ok


def test_bad_ground_truth_is_rejected():
    with pytest.raises(ValueError, match="equally long"):
        code_sandbox.parse_tests({"inputs": ["1"], "outputs": []})
    spec = code_sandbox.parse_tests({"input_output": json.dumps({"inputs": ["1"], "outputs": ["2"]})})
    assert spec == {"inputs": ["1"], "outputs": ["2"], "fn_name": None}
