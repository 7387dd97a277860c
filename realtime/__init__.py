"""The serving layer (imported as ``omni_stream.realtime``)."""
