"""An OpenEnv environment server for arithmetic: `python -m uvicorn openenv_calculator.server:app`.

Each WebSocket session is one episode. `reset(answer=...)` sets the number the episode expects;
the agent calls the MCP tools `calculate(expression)` (any number of times, reward 0) and
`submit(answer)`, which ends the episode with reward 1.0 when the answer equals the expected
number and 0.0 otherwise.
"""
