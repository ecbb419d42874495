"""The vLLM backend: ``VLLMEngineClient`` (asyncrl side) drives ``worker_main.py`` in vLLM's environment."""

from asyncrl.engine.vllm.client import VLLMEngineClient, default_vllm_python, vllm_python

__all__ = ["VLLMEngineClient", "default_vllm_python", "vllm_python"]
