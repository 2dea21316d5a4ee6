"""The audit's findings on code rewards (audit-2026-12-01: F12, F14, F15, F17), each as a
program that got its way before. Written against the API both sides share (score_code, reward,
per-test verdicts, Sandbox.run), so each can be run against the code before its fix."""

from __future__ import annotations

import json
import platform

import pytest

from scalerl.generator.code_reward import score_code
from scalerl.sandbox import Isolation, Limits, Sandbox
from scalerl.spec import CodeSpec

pytestmark = pytest.mark.usefixtures("nothing_left_behind")
SPEC = CodeSpec(test_timeout_seconds=3.0, problem_timeout_seconds=60.0, memory_mib=256)
STDIO = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})
ASSERTS = json.dumps(
    {"asserts": ["assert add(1, 2) == 3", "assert add(5, 7) == 12", "assert add(-1, 1) == 0"]}
)
RIGHT = "a, b = map(int, input().split())\nprint(a + b)\n"
LIMITS = Limits(wall_seconds=20.0, cpu_seconds=2, memory_bytes=256 << 20, output_bytes=1 << 20)


def _unscored(verdict: object) -> str:
    return str(getattr(verdict, "unscored", "") or getattr(verdict, "error", ""))


# --- F12: a program that ends or breaks its sandbox fails; it is never dropped ---------------

F12 = {
    "sigint to pid 1": "import os, signal\nos.kill(1, signal.SIGINT)\n",
    "1,500-deep tree": (
        "import os\nos.chdir('/tmp')\nfor _ in range(1500):\n    os.mkdir('a')\n    os.chdir('a')\n"
    ),
}


@pytest.mark.parametrize("name", F12)
@pytest.mark.parametrize("reference", [STDIO, ASSERTS], ids=["stdio", "asserts"])
def test_f12_a_program_that_attacks_its_sandbox_scores_minus_1_and_the_next_passes(
    name: str, reference: str, full_isolation: object
) -> None:
    wrong = "print(0)\n" if reference == STDIO else "def add(a, b):\n    return a - b\n"
    with Sandbox() as box:
        verdict = score_code(F12[name] + wrong, reference, SPEC, stop_early=True, sandbox=box)
        # Before: 'the sandbox ended: ... KeyboardInterrupt' / RecursionError, unscored (dropped).
        assert _unscored(verdict) == "" and verdict.reward == -1.0, verdict
        assert verdict.tests and not verdict.tests[0].passed
        assert score_code(RIGHT, STDIO, SPEC, sandbox=box).reward == 1.0


# --- F14: asserts judged outside the program ---------------------------------------------------

F14 = {
    "always-equal object": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return Anything()\n"
    ),
    "int subclass that lies": (
        "class Liar(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Liar(0)\n"
    ),
    "report written to fd 3": "import os\nos.write(3, b'{\"ok\": true}\\n' * 100)\nos._exit(0)\n",
    "exit 0 early": "import sys\nsys.exit(0)\n",
    "patched builtins": (
        "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\n"
        "builtins.isinstance = lambda *a: True\n"
        "def add(a, b):\n    return str(a + b)\n"
    ),
}


@pytest.mark.parametrize("name", F14)
def test_f14_an_assert_test_is_not_passed_by_a_lying_value_or_a_forged_report(
    name: str, full_isolation: object
) -> None:
    verdict = score_code(F14[name], ASSERTS, SPEC)
    # Before: the first three read +1, 3/3.
    assert _unscored(verdict) == "" and verdict.reward == -1.0 and verdict.passed == 0, verdict


# --- F15: nothing of one program is visible to the next ----------------------------------------

SEEDER = """
import sys
data = sys.stdin.read()
print('OUT' + 'MARK-' + data[:12] * 40)
"""
SCANNER = """
import re
found = set()
with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb') as mem:
    for line in maps:
        span, perms = line.split()[:2]
        if 'r' not in perms:
            continue
        start, end = (int(x, 16) for x in span.split('-'))
        try:
            mem.seek(start)
            chunk = mem.read(end - start)
        except (OSError, OverflowError, ValueError):
            continue
        found.update(m.decode() for m in re.findall(rb'(?:IN|OUT)MARK-[0-9a-z]{6}', chunk))
print(sorted(found))
"""


def test_f15_a_program_finds_no_earlier_programs_input_or_output_in_its_memory(
    full_isolation: object,
) -> None:
    with Sandbox() as box:
        for n in range(3):
            done = box.run(SEEDER, (f"INMARK-job{n:03d}" * 50).encode(), LIMITS)
            assert done.returncode == 0 and b"MARK-" in done.stdout
        scan = box.run(SCANNER, b"", LIMITS)
    assert scan.returncode == 0, scan.stderr
    # Before: ['INMARK-job002', 'OUTMARK-INMARK-...'] (the forked supervisor's heap).
    assert scan.stdout == b"[]\n"


LEAVER = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
attr = (ctypes.c_long * 8)(0, 4, 64, 0)
q = libc.mq_open(b'/leftover', os.O_CREAT | os.O_RDWR, 0o600, attr)
print('mq', q, libc.mq_send(q, b'from program 1', 14, 0) if q >= 0 else ctypes.get_errno())
key = libc.syscall(ADD_KEY, b'user', b'leftover', b'key of program 1', 16, -4)
print('key', key, ctypes.get_errno() if key < 0 else 0)
print('shm', libc.shmget(0x5CA1E, 4096, 0o1600))
"""
FINDER = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print('mq', libc.mq_open(b'/leftover', os.O_RDONLY))
print('key', libc.syscall(KEYCTL, 10, -4, b'user', b'leftover', 0))
print('shm', libc.shmget(0x5CA1E, 4096, 0))
"""


def test_f15_no_ipc_object_or_key_of_one_program_reaches_the_next(full_isolation: object) -> None:
    numbers = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(platform.machine())
    if numbers is None:
        pytest.skip(f"keyring syscall numbers not known for {platform.machine()}")
    leaver = LEAVER.replace("ADD_KEY", str(numbers[0]))
    finder = FINDER.replace("KEYCTL", str(numbers[1]))
    with Sandbox() as box:
        left = box.run(leaver, b"", LIMITS).stdout.decode().split()
        box.run("print('an unrelated program')", b"", LIMITS)
        found = box.run(finder, b"", LIMITS).stdout.decode().split()
    assert left[:2] == ["mq", left[1]] and int(left[1]) >= 0 and left[2] == "0"  # it was made
    # Before: the queue and the key were there for the program after next.
    assert found == ["mq", "-1", "key", "-1", "shm", "-1"], (left, found)


# --- F17: limits hold for a program, not for each of its processes ----------------------------

CPU_SPLIT = """
import os, time
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        end = time.process_time() + 0.8
        while time.process_time() < end:
            pass
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
a, b = map(int, input().split())
print(a + b)
"""
MEMORY_SPLIT = """
import os, time
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(200 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(1.0)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
a, b = map(int, input().split())
print(a + b)
"""


# Where the sandbox has no /proc (a container's is masked), its supervisor adds a program's
# processes up in the /proc of the process that started it.
PROCS = [Isolation("bwrap"), Isolation("bwrap", reason="a masked /proc here", proc=False)]


@pytest.mark.parametrize("mode", PROCS, ids=["own /proc", "no /proc"])
def test_f17_cpu_split_over_processes_counts_against_the_program(
    mode: Isolation, full_isolation: object
) -> None:
    # 1 s of CPU for the program: four processes of 0.8 s each stay under the per-process
    # limit. Before: it ran to the end and printed 3.
    with Sandbox(mode) as box:
        limits = Limits(wall_seconds=30.0, cpu_seconds=1, memory_bytes=256 << 20)
        done = box.run(CPU_SPLIT, b"1 2\n", limits)
    assert done.returncode == -9 and done.stdout == b"", done
    assert getattr(done, "cpu_exceeded", False) and not done.timed_out


@pytest.mark.parametrize("mode", PROCS, ids=["own /proc", "no /proc"])
def test_f17_memory_split_over_processes_counts_against_the_program(
    mode: Isolation, full_isolation: object
) -> None:
    # 256 MiB for the program: four processes of 200 MiB each stay under the per-process
    # address-space limit. Before: +1.
    spec = CodeSpec(test_timeout_seconds=5.0, problem_timeout_seconds=60.0, memory_mib=256)
    with Sandbox(mode) as box:
        result = score_code(MEMORY_SPLIT, STDIO, spec, sandbox=box)
    assert result.reward == -1.0 and [t.verdict for t in result.tests] == ["memory"], result


NAMER = """
import ctypes, time
name = ('NAME' + 'MARK-' + 'abc123').encode()
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME: its comm
end = time.monotonic() + 0.5
while time.monotonic() < end:  # long enough for the supervisor to add up its CPU time
    pass
"""


def test_f15_a_programs_process_name_does_not_reach_the_next_through_the_supervisor(
    full_isolation: object,
) -> None:
    # The supervisor reads every process's stat line (CPU and memory sums); the line holds the
    # process's name, which the program sets. Left in the supervisor's heap, the next fork has it.
    with Sandbox() as box:
        named = box.run(NAMER, b"", LIMITS)
        scan = box.run(SCANNER.replace("(?:IN|OUT)MARK", "NAMEMARK"), b"", LIMITS)
    assert named.returncode == 0 and scan.returncode == 0, (named, scan)
    assert scan.stdout == b"[]\n"
