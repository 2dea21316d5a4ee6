"""ScaleRL Operator: ScaleRL post-training of LLMs and prediction of where each run ends."""
