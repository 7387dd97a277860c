"""Native causal LMs (Qwen3, Llama) from hub-layout checkpoints on the batch scheduler: the ``text`` kind.

``config.py`` (config.json, generation_config.json), ``model.py`` (modules named like the hub, loading),
``tokenizer.py`` (chat template, encode/decode), ``detokenize.py`` (incremental text and stop strings),
``runner.py`` (the BatchModel: slot KV cache, batched prefill, per-row sampling, CUDA graphs), ``family.py``
(the TextFamily and the embedded default), ``checkpoint.py`` (tiny and real-size random checkpoints).
"""
