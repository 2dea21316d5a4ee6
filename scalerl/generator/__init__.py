"""The generator process: vLLM engine driver (`engine`), ScaleRL length rules (`length`), the
worker extension that receives weights in place (`worker`), prompts, rewards and the process loop.

Nothing is imported here: vLLM imports `scalerl.generator.worker` inside its engine process, which
should not pay for the driver's imports.
"""
