"""truthput: A/B-test LLM inference server configurations and report the throughput that is really there."""

__version__ = "0.1.0"
