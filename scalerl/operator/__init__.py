"""The ScaleRL operator: kopf handlers that turn a ScaleRLRun into its pods and status.

`kopf run -m scalerl.operator` imports this package, which registers the handlers in kopf's
default registry; `scalerl operator` does the same with kubectl-like connection defaults. Tests
register them in registries of their own (`scalerl.operator.handlers.register`).
"""

import kopf

from scalerl.operator.handlers import register

register(kopf.get_default_registry())
