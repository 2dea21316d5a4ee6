"""One sandbox runs program after program (as a run's scoring workers keep theirs): each gets
fresh limits and a clean machine, whatever the one before it did, and the sandbox itself is out
of the programs' reach."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from scalerl.sandbox import Limits, Sandbox
from scalerl.sandbox.isolation import plain

pytestmark = pytest.mark.usefixtures("nothing_left_behind")
LIMITS = Limits(wall_seconds=30.0, cpu_seconds=1, memory_bytes=256 << 20, output_bytes=1 << 20)

# Leaves all it can behind: a process that left its group and ignores SIGTERM, files in every
# place it may write, and a System V shared-memory segment.
LITTERER = """
import ctypes, os, signal
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        open('/tmp/still-here', 'w').write(str(os.getpid()))
        os.sched_yield()
for path in ('left', '../left', '/tmp/left', '/dev/shm/left'):
    open(path, 'w').write('litter')
os.mkdir('/tmp/locked')
os.chmod('/tmp/locked', 0)
libc = ctypes.CDLL(None)
print('segment', libc.shmget(0x5CA1E, 4096, 0o1600))
"""

# What the next program finds: the processes it can see, every place it may write, the segments.
LOOKER = """
import glob, os
print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getpid())
print('files', sorted(glob.glob('/tmp/*') + glob.glob('/dev/shm/*') + glob.glob('../*')))
print('segments', open('/proc/sysvipc/shm').read().splitlines()[1:])
"""


def test_the_next_program_finds_nothing_the_last_one_left(full_isolation: object) -> None:
    with Sandbox() as box:
        litter = box.run(LITTERER, limits=LIMITS)
        assert litter.returncode == 0, litter.stderr
        assert int(litter.stdout.split()[1]) >= 0  # the segment was made
        pids, files, segments = box.run(LOOKER, limits=LIMITS).stdout.decode().splitlines()
    own = int(pids.split()[-1])
    assert pids == f"pids {sorted([1, own])} {own}"  # the supervisor (pid 1) and itself
    (folder,) = eval(files.split(" ", 1)[1])  # noqa: S307 — a list the test's program printed
    assert Path(folder).name.startswith("job-")  # its own folder, nothing else anywhere
    assert segments == "segments []"


def test_each_program_gets_its_own_cpu_time(full_isolation: object) -> None:
    # 0.6 s of CPU each under a 1 s limit: counted together, the second would be killed.
    burn = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
    with Sandbox() as box:
        runs = [box.run(burn, limits=LIMITS) for _ in range(3)]
    assert [r.returncode for r in runs] == [0, 0, 0]


def test_a_program_cannot_stop_trace_or_read_the_sandbox_that_runs_it(
    full_isolation: object,
) -> None:
    attack = """
import os, signal
for what, act in [
    ('kill 1', lambda: os.kill(1, signal.SIGKILL)),
    ('stop 1', lambda: os.kill(1, signal.SIGSTOP)),
    ('kill all', lambda: os.kill(-1, signal.SIGKILL)),
    ('memory', lambda: open('/proc/1/mem', 'rb').read(1)),
    ('environ', lambda: open('/proc/1/environ', 'rb').read()),
]:
    try:
        act()
        print(what, 'done')
    except OSError as err:
        print(what, 'refused', err.errno)
"""
    with Sandbox() as box:
        first = box.run(attack, limits=LIMITS)
        after = box.run("print('next')", limits=LIMITS)
    lines = first.stdout.decode().splitlines()
    # Signals to the namespace's first process are dropped by the kernel (no error, no effect);
    # its memory and environment are refused (it is not dumpable).
    assert [line.split()[-2] for line in lines[-2:]] == ["refused", "refused"], lines
    assert after.returncode == 0 and after.stdout == b"next\n" and not after.error


def test_a_sandbox_killed_from_outside_is_started_anew_for_the_next_program(
    full_isolation: object,
) -> None:
    with Sandbox() as box:
        assert box.run("print(1)", limits=LIMITS).stdout == b"1\n"
        assert box._proc is not None and box._inner > 0
        os.kill(box._inner, signal.SIGKILL)  # its supervisor, as the kernel's OOM killer would
        box._proc.wait()
        again = box.run("print(2)", limits=LIMITS)
    assert again.stdout == b"2\n" and not again.error


def test_without_namespaces_a_kept_sandbox_still_clears_its_folder_and_group(
    full_isolation: object,
) -> None:
    litter = "import os\nopen('left', 'w').write('x')\nopen('../left', 'w').write('x')\n"
    look = "import os\nprint(sorted(os.listdir('..')))\n"
    with Sandbox(plain("namespaces refused in this test")) as box:
        assert box.run(litter, limits=LIMITS).returncode == 0
        seen = box.run(look, limits=LIMITS).stdout.decode()
    assert seen.count("job-") == 1 and "left" not in seen


def test_without_the_capability_a_kept_sandbox_empties_deep_trees_and_floods(
    full_isolation: object,
) -> None:
    # Where bubblewrap refuses --cap-add: programs share /tmp, /dev/shm and the folder, emptied
    # after each without recursion (os.walk died at 1,000 levels before).
    from scalerl.sandbox.isolation import FRESH_MACHINE, Isolation

    shared = Isolation("bwrap", (FRESH_MACHINE,), "capability refused in this test")
    deep = (
        "import os\nos.chdir('/tmp')\nfor _ in range(1500):\n    os.mkdir('a')\n    os.chdir('a')\n"
    )
    flood = "for n in range(3000):\n    open(f'/dev/shm/f{n}', 'w').close()\n"
    with Sandbox(shared) as box:
        assert box.run(deep, limits=LIMITS).returncode == 0
        assert box.run(flood, limits=LIMITS).returncode == 0
        seen = box.run(LOOKER, limits=LIMITS)
    assert not seen.damaged and seen.returncode == 0, seen
    files = seen.stdout.decode().splitlines()[1]
    (folder,) = eval(files.split(" ", 1)[1])  # noqa: S307 — a list the test's program printed
    assert Path(folder).name.startswith("job-")


def test_only_a_setup_that_fails_before_the_program_runs_is_unscored(
    full_isolation: object,
) -> None:
    # A file the sandbox cannot write (a name over 255 bytes) fails the setup: the program never
    # ran, no program caused it: unscored. A program that ends the way a failed setup does
    # (exit 127, a message on every descriptor) is scored: it cannot say "unscored" itself.
    mimic = (
        "import os\nfor fd in range(3, 64):\n    try:\n"
        "        os.write(fd, b'setup failed: forged')\n    except OSError:\n        pass\n"
        "os._exit(127)\n"
    )
    with Sandbox() as box:
        refused = box.run("print(1)", limits=LIMITS, files={"x" * 300: "text"})
        forged = box.run(mimic, limits=LIMITS)
        after = box.run("print(2)", limits=LIMITS)
    assert refused.error.startswith("setup failed") and refused.returncode is None
    assert forged.error == "" and forged.returncode == 127 and not forged.damaged
    assert after.stdout == b"2\n"


def test_a_supervisor_that_dies_while_a_program_runs_fails_that_program(
    full_isolation: object,
) -> None:
    import threading
    import time

    with Sandbox() as box:
        assert box.run("print(1)", limits=LIMITS).stdout == b"1\n"
        inner = box._inner

        def crash() -> None:
            time.sleep(1.0)
            os.kill(inner, signal.SIGKILL)  # as the host's OOM killer would, mid-program

        killer = threading.Thread(target=crash)
        killer.start()
        crashed = box.run(
            "import time\nprint('started', flush=True)\ntime.sleep(20)\n", limits=LIMITS
        )
        killer.join()
        after = box.run("print(2)", limits=LIMITS)
    # The program's own failure (damaged, never unscored); the next one gets a new sandbox.
    assert crashed.error == "" and crashed.damaged.startswith("the sandbox ended"), crashed
    assert crashed.stdout == b"started\n" and crashed.wall_seconds < 15
    assert after.stdout == b"2\n" and not after.error and not after.damaged
