"""Multi-turn and tool-use rollouts from environments users already have (verifiers, OpenEnv).

The environment runs unchanged and talks to the generator's own engine through `EngineClient`, a
verifiers client that renders the conversation with the model's chat template, samples the
model's turn token in and token out, and records what it sampled. `assemble` turns a rollout's
recorded turns into one training sample: the model's tokens trained, the environment's masked out,
split where the chat template did not keep the prefix.
"""
