"""Hostile programs in the sandbox: each is contained, ends the way the record says, and leaves
nothing behind (no process, no folder, no file outside its own folder)."""

from __future__ import annotations

import dataclasses
import glob
import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from scalerl.sandbox import Limits, execute

pytestmark = pytest.mark.usefixtures("nothing_left_behind")
SHORT = Limits(wall_seconds=2.0, cpu_seconds=1, memory_bytes=256 << 20, output_bytes=1 << 20)


def test_an_infinite_loop_is_stopped_by_its_cpu_limit() -> None:
    # A wall limit far above the CPU limit: on a loaded machine the loop gets a fraction of a
    # core, and a 2 s wall once ran out before 1 s of CPU was spent.
    limits = dataclasses.replace(SHORT, wall_seconds=60.0)
    done = execute("while True:\n    pass\n", limits=limits)
    assert done.signal == signal.SIGKILL and not done.timed_out  # the CPU limit, not the wall
    assert done.wall_seconds < 60.0


def test_a_sleeper_that_ignores_sigterm_is_killed_at_the_wall_limit() -> None:
    program = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"
    started = time.monotonic()
    done = execute(program, limits=SHORT)
    assert done.timed_out
    assert 2.0 <= time.monotonic() - started < 4.0


def test_a_fork_bomb_meets_the_process_limit_and_dies_with_its_namespace() -> None:
    program = (
        "import os\n"
        "refused = 0\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        refused += 1\n"
        "        if refused == 1000: print('refused', flush=True)\n"
    )
    # A CPU limit far above what 16 spinning processes can use in 2 s on any machine, so the wall
    # clock is what ends it: with 2 CPU seconds, their sum can pass the limit first (a CI run
    # ended it with cpu_exceeded, not timed_out).
    limits = Limits(wall_seconds=2.0, cpu_seconds=120, processes=16, output_bytes=1 << 20)
    done = execute(program, limits=limits)
    assert done.timed_out
    assert b"refused" in done.stdout  # the kernel refused forks past the limit


def test_a_10_gb_allocation_fails_inside_the_memory_limit() -> None:
    done = execute("block = bytearray(10 * 1024**3)\n", limits=SHORT)
    assert done.returncode == 1 and done.memory_exceeded


def test_a_connection_to_a_port_the_test_listens_on_never_arrives() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        program = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'x')\n"
            "    print('connected')\n"
            "except OSError as err:\n"
            "    print('refused', err.errno)\n"
        )
        done = execute(program, limits=SHORT)
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()
    assert done.returncode == 0 and done.stdout.startswith(b"refused")


def test_writes_to_home_and_to_tmp_outside_its_folder_go_nowhere() -> None:
    name = f"scalerl-escape-{uuid.uuid4().hex}"
    # /tmp by name: the sandbox mounts its own there, whatever TMPDIR says outside.
    targets = [Path.home() / name, Path("/tmp") / name, Path("/") / name]
    program = "import sys\nfor path in sys.argv[1:] or %r:\n" % [str(t) for t in targets] + (
        "    try:\n"
        "        open(path, 'w').write('escaped')\n"
        "        print('wrote', path)\n"
        "    except OSError as err:\n"
        "        print('refused', path, err.errno)\n"
    )
    done = execute(program, limits=SHORT)
    assert done.returncode == 0
    # Home and / refuse; /tmp is the sandbox's own small tmpfs, gone with it.
    assert done.stdout.count(b"refused") == 2 and b"wrote /tmp/" in done.stdout, done.stdout
    assert [t for t in targets if t.exists()] == []


def test_a_run_cannot_read_another_runs_files() -> None:
    secret = uuid.uuid4().hex
    # The first run's program (its source holds the secret) sleeps while the second looks.
    sleeper = f"import time\nSECRET = {secret!r}\ntime.sleep(1.5)\n"
    first = threading.Thread(target=execute, args=(sleeper,), kwargs={"limits": SHORT})
    first.start()
    try:
        # It is there, on this machine, seen from outside through its supervisor's root (among
        # the programs of other tests running meanwhile, under pytest-xdist).
        found = _wait_for(
            lambda: [
                path
                for path in glob.glob("/proc/[0-9]*/root/sandbox/job-*/main.py")
                if secret in _text(path)
            ]
        )
        assert found
        reader = (
            "import glob\n"
            f"paths = [{found[0]!r}] + glob.glob('/proc/[0-9]*/root/sandbox/*/main.py')\n"
            "paths += glob.glob('/sandbox/*/*') + glob.glob('/tmp/**', recursive=True)\n"
            "for path in paths:\n"
            "    try:\n"
            "        print(path, open(path).read())\n"
            "    except OSError as err:\n"
            "        print('refused', path, err.errno)\n"
        )
        done = execute(reader, limits=SHORT)
    finally:
        first.join()
    assert done.returncode == 0, done.stderr
    assert secret.encode() not in done.stdout
    assert done.stdout.startswith(b"refused"), done.stdout  # the other's path is not there


def test_a_1_gb_print_is_cut_at_the_output_limit() -> None:
    started = time.monotonic()
    program = "import sys\nmib = 'x' * 1024**2\nfor _ in range(1024):\n    sys.stdout.write(mib)\n"
    done = execute(program, limits=SHORT)
    assert done.output_exceeded and len(done.stdout) == SHORT.output_bytes
    assert time.monotonic() - started < 2.0


def test_endless_stderr_is_cut_at_the_output_limit_too() -> None:
    program = "import sys\nwhile True:\n    sys.stderr.write('e' * 4096 + '\\n')\n"
    done = execute(program, limits=SHORT)
    assert done.output_exceeded and not done.timed_out
    assert len(done.stderr) == 64 << 10 and set(done.stderr) <= set(b"e\n")  # its last 64 KiB


def test_killing_its_parent_and_every_process_it_sees_harms_nothing_outside() -> None:
    bystander = _start_bystander()
    program = (
        "import os, signal\n"
        "for target in (os.getppid(), -1):\n"
        "    try:\n"
        "        os.kill(target, signal.SIGKILL)\n"
        "    except OSError as err:\n"
        "        print('refused', target, err.errno)\n"
        "print('still here', flush=True)\n"
    )
    try:
        done = execute(program, limits=SHORT)
        assert bystander.poll() is None  # a process of the sandbox's own user, outside it
    finally:
        bystander.kill()
        bystander.wait()
    assert os.getpid() > 0 and done.error == ""


def _start_bystander():  # type: ignore[no-untyped-def]
    import subprocess

    from scalerl.sandbox.isolation import as_sandbox_user

    return subprocess.Popen(
        ["sleep", "30"], **as_sandbox_user()
    )  # the sandbox's user: a fair target


def _text(path: str) -> str:
    """The file's text, or "" when it is gone or refused (another test's program that ended)."""
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _wait_for(found, seconds: float = 5.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if result := found():
            return result
        time.sleep(0.02)
    return found()


def test_filling_its_folder_tmp_and_shm_stops_at_their_small_size() -> None:
    program = (
        "import os\n"
        "block = b'x' * (1 << 20)\n"
        "for place in ('.', '/tmp', '/dev/shm'):\n"
        "    written = 0\n"
        "    try:\n"
        "        for n in range(200):\n"
        "            with open(os.path.join(place, f'fill{n}'), 'wb') as f:\n"
        "                for _ in range(4):\n"
        "                    f.write(block)\n"
        "                    written += 1\n"
        "    except OSError as err:\n"
        "        print(place, written, err.errno)\n"
        "try:\n"
        "    open('/dev/extra', 'w')\n"
        "except OSError as err:\n"
        "    print('/dev', err.errno)\n"
    )
    done = execute(program, limits=SHORT)
    assert done.returncode == 0, done.stderr
    *filled, dev = [line.split() for line in done.stdout.decode().splitlines()]
    # Each place took at most its 16 MiB (then ENOSPC, 28), not the 800 MiB asked for.
    assert [(place, errno) for place, _, errno in filled] == [
        (".", "28"),
        ("/tmp", "28"),
        ("/dev/shm", "28"),
    ]
    assert max(int(mib) for _, mib, _ in filled) <= 16
    assert dev == ["/dev", "30"]  # read-only
