"""Qwen2.5-VL (``model_type: qwen2_5_vl``): a vision-language text family on our decoder and batch scheduler.

``config.py`` (config.json and preprocessor_config.json), ``vision.py`` (pure image policy: resize, normalize,
patchify, multimodal rotary positions), ``model.py`` (transformers' vision tower and our Qwen2 decoder with q/k/v
bias and M-RoPE, named like the hub), ``checkpoint.py`` (tiny and real-size random checkpoints), ``prompt.py`` (a
request's ids, images and positions), ``runner.py`` (the batched runner: images spliced at prefill, per-slot rotary
deltas, frame sessions' held rows), ``frames.py`` and ``session.py`` (frame sessions: what they publish, their async
API), ``family.py`` (the text-kind family).
"""
