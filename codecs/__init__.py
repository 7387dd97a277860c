"""Streaming wire audio formats and resampling (imported as ``omni_stream.codecs``; imports nothing else of omni-stream)."""
