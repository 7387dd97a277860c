"""Text generation on vLLM's ``AsyncLLM`` in process (family ``vllm``, the ``[vllm]`` extra); see :mod:`.family`."""
