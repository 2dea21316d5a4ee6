"""What runs first inside the sandbox, before the program: the resource limits, then the program.

Executed as `python -I -c <this file's text> LIMITS MAIN` by scalerl.sandbox.run; it is not
imported by scalerl itself. The limits are set here rather than before the sandbox starts because
a process-count limit only counts the sandbox's own processes once it is inside its own user
namespace (the kernel counts RLIMIT_NPROC per user of a user namespace). Stays standard library
only: the sandbox's interpreter is the system's, without scalerl installed.
"""

import json
import resource
import runpy
import sys


def _limit(which: int, value: int) -> None:
    if value > 0:
        resource.setrlimit(which, (value, value))


def main() -> None:
    limits = json.loads(sys.argv[1])
    _limit(resource.RLIMIT_AS, limits["memory_bytes"])
    _limit(resource.RLIMIT_FSIZE, limits["file_bytes"])
    _limit(resource.RLIMIT_NPROC, limits["processes"])
    # Soft and hard alike: the kernel's SIGKILL at the hard limit, because under bubblewrap the
    # program is its PID namespace's first process, which ignores a default-handled SIGXCPU.
    _limit(resource.RLIMIT_CPU, limits["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main_path = sys.argv[2]
    sys.argv = [main_path]
    sys.path.insert(0, ".")
    runpy.run_path(main_path, run_name="__main__")


main()
