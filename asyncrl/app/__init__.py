"""The composition root: build a run's parts from its config for a runtime, wire them, run them.

``train``, ``evaluate`` and ``simulate`` all assemble through ``app.wiring`` (buffer, producer, controller)
and ``app.runtimes`` (parts per runtime: inline or Ray); the simulator substitutes cost-model workers for the
engines, trainer, rewards and tokenizer. Nothing below ``app/`` imports it.
"""
