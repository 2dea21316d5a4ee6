"""Hostile completions through `reward: code`, over all three test shapes, in ONE kept sandbox (as
a scoring worker keeps its): reward hacks, sandbox killers, escapes and floods. Each must score
-1 with a verdict (never unscored: nothing here is beyond a program's reach), leave no process,
file or IPC object for the next program, and a correct program must still score +1 right after
it in the same sandbox."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalerl.generator.code_reward import PASSED, score_code
from scalerl.sandbox import Limits, Sandbox
from scalerl.spec import CodeSpec

# A hostile program gets 1 s a test (whatever ends it, a timeout included, is a failing verdict);
# the right one after it the 2 s of a loaded machine's worst case.
SPEC = CodeSpec(
    test_timeout_seconds=1.0, problem_timeout_seconds=30.0, memory_mib=256, output_mib=1
)
RIGHT_SPEC = SPEC.model_copy(update={"test_timeout_seconds": 2.0})
REFERENCES = {
    "stdio": json.dumps({"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}),
    "call": json.dumps({"fn_name": "add", "inputs": [[1, 2], [5, 7]], "outputs": [3, 12]}),
    "asserts": json.dumps(
        {"asserts": ["assert add(1, 2) == 3", "assert add(5, 7) == 12", "assert add(-1, 1) == 0"]}
    ),
}
RIGHT = {
    "stdio": "a, b = map(int, input().split())\nprint(a + b)\n",
    "call": "def add(a, b):\n    return a + b\n",
    "asserts": "def add(a, b):\n    return a + b\n",
}
WRONG = {  # appended to an attack that does not answer itself
    "stdio": "\nprint(0)\n",
    "call": "\ndef add(a, b):\n    return a - b\n",
    "asserts": "\ndef add(a, b):\n    return a - b\n",
}

# name -> (the attack, whether it answers by itself: no wrong solution appended)
HOSTILE: dict[str, tuple[str, bool]] = {
    # reward hacks
    "always-equal object": (
        "class A:\n    def __eq__(s, o): return True\n    def __ne__(s, o): return False\n"
        "def add(a, b): return A()\n"
        "import sys\nif __name__ == '__main__': print(A())\n",
        True,
    ),
    "int subclass that lies": (
        "class L(int):\n    def __eq__(s, o): return True\n    __hash__ = int.__hash__\n"
        "def add(a, b): return L(0)\n",
        False,
    ),
    "str subclass that lies": (
        "class S(str):\n    def __eq__(s, o): return True\n    __hash__ = str.__hash__\n"
        "def add(a, b): return S('0')\n",
        False,
    ),
    "report forged on fd 3": (
        "import os\nfor fd in (1, 3):\n    try:\n"
        '        os.write(fd, b\'{"ok": true, "values": [["i", "3"]], "value": ["i", "3"]}\\n\' * 50)\n'  # noqa: E501
        "    except OSError:\n        pass\nos._exit(0)\n",
        True,
    ),
    "exit 0 at import": ("import sys\nsys.exit(0)\n", True),
    "os._exit(0) inside the call": ("import os\ndef add(a, b):\n    os._exit(0)\n", True),
    "patched builtins": (
        "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: int\n"
        "builtins.AssertionError = type('X', (Exception,), {})\n",
        False,
    ),
    "patched harness": (
        "import sys\nm = sys.modules['__main__']\n"
        "for name in ('tag', '_run', 'json'):\n    setattr(m, name, None) if hasattr(m, name) else None\n",  # noqa: E501
        False,
    ),
    "reads every file for answers": (
        "import glob\nfor p in glob.glob('/**', recursive=True)[:3000]:\n    try:\n"
        "        open(p).read(1000)\n    except Exception:\n        pass\n",
        False,
    ),
    # sandbox killers
    "sigint to pid 1": ("import os, signal\nos.kill(1, signal.SIGINT)\n", False),
    "every signal to pid 1": (
        "import os\nfor s in range(1, 32):\n    try:\n        os.kill(1, s)\n    except OSError:\n"
        "        pass\n",
        False,
    ),
    "kill -1": ("import os, signal\nos.kill(-1, signal.SIGKILL)\n", False),
    "1,500-deep tree in /tmp": (
        "import os\nos.chdir('/tmp')\n"
        "for _ in range(1500):\n    os.mkdir('a')\n    os.chdir('a')\n",
        False,
    ),
    "deep tree of long names": (
        "import os\nos.chdir('/dev/shm')\nfor _ in range(3000):\n    try:\n"
        "        os.mkdir('d' * 200)\n        os.chdir('d' * 200)\n    except OSError:\n"
        "        break\n",
        False,
    ),
    "inode flood": (
        "import os\nfor place in ('/tmp', '/dev/shm', '.'):\n    for n in range(100000):\n"
        "        try:\n            open(f'{place}/f{n}', 'w').close()\n        except OSError:\n"
        "            break\n",
        False,
    ),
    "unreadable folders and a symlink loop": (
        "import os\nos.makedirs('/tmp/x/y/z')\nos.chmod('/tmp/x/y', 0)\nos.chmod('/tmp/x', 0)\n"
        "os.symlink('/tmp/loop', '/tmp/loop')\n",
        False,
    ),
    "stdout flood": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", True),
    "stderr flood": ("import sys\nwhile True:\n    sys.stderr.write('e' * 65536)\n", True),
    "fork bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        True,
    ),
    "memory hog": ("block = bytearray(10 * 1024**3)\n", False),
    "memory over processes": (
        "import os, time\nfor _ in range(6):\n    if os.fork() == 0:\n"
        "        b = bytearray(120 << 20)\n        b[::4096] = b'x' * len(b[::4096])\n"
        "        time.sleep(5)\n        os._exit(0)\ntime.sleep(5)\n",
        False,
    ),
    "busy loop": ("while True:\n    pass\n", True),
    "sleeper deaf to SIGTERM": (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n",
        True,
    ),
    "daemon left behind": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(600)\n    os._exit(0)\n",
        False,
    ),
    "endless thread": (
        "import threading, time\nthreading.Thread(target=lambda: time.sleep(600)).start()\n",
        False,
    ),
    "ipc and keyring leftovers": (
        "import ctypes, os\nlibc = ctypes.CDLL(None)\nlibc.shmget(0x5CA1E, 4096, 0o1600)\n"
        "libc.semget(0x5CA1F, 1, 0o1600)\nlibc.msgget(0x5CA20, 0o1600)\n"
        "attr = (ctypes.c_long * 8)(0, 4, 64, 0)\n"
        "libc.mq_open(b'/leftover', os.O_CREAT | os.O_RDWR, 0o600, attr)\n"
        "import platform\nadd_key = {'x86_64': 248, 'aarch64': 217}.get(platform.machine())\n"
        "if add_key:\n    libc.syscall(add_key, b'user', b'leftover', b'k', 1, -4)\n"
        "open('/dev/shm/sem.left', 'w').write('x')\n",
        False,
    ),
    # escapes
    "writes outside and reads the supervisor": (
        "import os\nfor act in (lambda: open('/left', 'w'), lambda: open('/usr/left', 'w'),\n"
        "            lambda: open('/proc/1/mem', 'rb').read(1),\n"
        "            lambda: open('/proc/1/environ').read(),\n"
        "            lambda: os.setuid(0)):\n    try:\n        act()\n    except Exception:\n"
        "        pass\n",
        False,
    ),
    "mounts, namespaces and capabilities": (
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "libc.mount(b'tmpfs', b'/usr', b'tmpfs', 0, None)\n"
        "libc.unshare(0x00020000 | 0x10000000)\nlibc.umount2(b'/tmp', 2)\n",
        False,
    ),
    "network": (
        "import socket\nfor port in (22, 80, 8080):\n    try:\n"
        "        socket.create_connection(('127.0.0.1', port), timeout=0.2)\n    except OSError:\n"
        "        pass\n",
        False,
    ),
    "closes every descriptor": ("import os\nos.closerange(0, 1024)\n", False),
    "segfault": ("import ctypes\nctypes.string_at(0)\n", True),
}

LOOKER = """
import ctypes, glob, os
libc = ctypes.CDLL(None, use_errno=True)
found = glob.glob('/tmp/*') + glob.glob('/tmp/.*') + glob.glob('/dev/shm/*')
found += [p for p in glob.glob('../*') + glob.glob('../.*') if os.path.abspath(p) != os.getcwd()]
found += [p for p in glob.glob('*') + glob.glob('.*') if p != 'main.py']
found += ['pid ' + p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid())]
for kind in ('shm', 'sem', 'msg'):
    found += [kind + ' ' + row for row in open('/proc/sysvipc/' + kind).read().splitlines()[1:]]
if libc.mq_open(b'/leftover', os.O_RDONLY) >= 0:
    found.append('mq')
print(found)
"""
LOOK_LIMITS = Limits(wall_seconds=20.0, cpu_seconds=5, memory_bytes=256 << 20)


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.fixture(scope="module")
def kept(full_isolation: object) -> Iterator[Sandbox]:
    with Sandbox() as box:
        yield box


CASES = [(shape, name) for name in HOSTILE for shape in REFERENCES]


def test_there_are_at_least_25_hostile_programs() -> None:
    assert len(HOSTILE) >= 25 and len(CASES) >= 75


@pytest.mark.parametrize(("shape", "name"), CASES)
def test_a_hostile_program_fails_and_the_next_program_finds_a_sound_sandbox(
    shape: str, name: str, kept: Sandbox
) -> None:
    attack, answers = HOSTILE[name]
    program = attack if answers else attack + WRONG[shape]
    verdict = score_code(program, REFERENCES[shape], SPEC, stop_early=True, sandbox=kept)
    assert verdict.unscored == "", verdict  # never dropped
    assert verdict.reward == -1.0 and verdict.tests, verdict
    assert any(t.verdict != PASSED for t in verdict.tests)
    assert all(t.verdict for t in verdict.tests)
    # Nothing it left: no process, file or IPC object seen from inside ...
    look = kept.run(LOOKER, b"", LOOK_LIMITS)
    assert look.returncode == 0 and look.stdout == b"[]\n", (look.stdout, look.stderr)
    # ... nor from outside: bubblewrap's one process below it, the supervisor.
    assert kept._proc is not None
    assert _descendants(kept._proc.pid) == {kept._inner}
    right = score_code(RIGHT[shape], REFERENCES[shape], RIGHT_SPEC, sandbox=kept)
    assert right.reward == 1.0, right
