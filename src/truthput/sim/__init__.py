"""The embedded simulator: a vLLM-compatible OpenAI server whose speed comes from the physics model.

Run it as `python -m truthput.sim serve ...` (or `truthput sim serve ...`). Nothing in truthput's
core imports this package; the runner launches it as a subprocess like any real engine.
Constants tests and audits rely on: truthput.sim.textgen.WORDS_PER_TOKEN (exact 0.75).
"""
