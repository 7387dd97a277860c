"""Helios (chunk-autoregressive video diffusion, diffusers' ``HeliosPipeline``) as a ``video`` family."""
