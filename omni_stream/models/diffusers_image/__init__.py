"""Image models on diffusers pipelines (``model_type: diffusers``): InstructPix2Pix, Stable Diffusion, Qwen-Image-Edit.

``family`` serves a pipeline directory as ``kind: image``; ``checkpoint`` writes tiny random ones offline.
Needs the ``[image]`` extra (diffusers, Pillow).
"""
