"""`python -m scalerl.operator [--namespace NS]`: the same as `scalerl operator`."""

import sys

from scalerl.cli import main

sys.exit(main(["operator", *sys.argv[1:]]))
