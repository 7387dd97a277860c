"""Qwen2.5-VL (``model_type: qwen2_5_vl``): a vision-language text family on our decoder and batch scheduler.

``config.py`` (config.json and preprocessor_config.json), ``vision.py`` (pure image policy: resize, normalize,
patchify, multimodal rotary positions), ``model.py`` (transformers' vision tower and our Qwen2 decoder with q/k/v
bias and M-RoPE, named like the hub), ``checkpoint.py`` (tiny and real-size random checkpoints).
"""
