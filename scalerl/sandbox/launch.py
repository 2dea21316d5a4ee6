"""What runs first inside the sandbox, before the program: the resource limits, then the program.

Executed as `python -I -c <this file's text> "MEMORY FILE PROCESSES CPU" MAIN` by
scalerl.sandbox.run (the limits as integers, in that order); it is not imported by scalerl itself.
The limits are set here rather than before the sandbox starts because a process-count limit only
counts the sandbox's own processes once it is inside its own user namespace (the kernel counts
RLIMIT_NPROC per user of a user namespace). Stays standard library only, and runs on any Python
3: the sandbox's interpreter is the system's, without scalerl installed.
"""

import resource
import sys


def _limit(which: int, value: int) -> None:
    if value > 0:
        resource.setrlimit(which, (value, value))


def main() -> None:
    # Plain integers, not JSON: importing json (and re with it) would cost every execution ~8 ms.
    memory, files, processes, cpu = map(int, sys.argv[1].split())
    _limit(resource.RLIMIT_AS, memory)
    _limit(resource.RLIMIT_FSIZE, files)
    _limit(resource.RLIMIT_NPROC, processes)
    # Soft and hard alike: the kernel's SIGKILL at the hard limit, because under bubblewrap the
    # program is its PID namespace's first process, which ignores a default-handled SIGXCPU.
    _limit(resource.RLIMIT_CPU, cpu)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main_path = sys.argv[2]
    sys.argv = [main_path]
    sys.path.insert(0, ".")
    # The program as `__main__`, as `python main.py` would run it (runpy does the same but costs
    # every execution ~7 ms of imports).
    with open(main_path, "rb") as file:
        code = compile(file.read(), main_path, "exec")
    module = type(sys)("__main__")
    module.__file__ = main_path
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


main()
