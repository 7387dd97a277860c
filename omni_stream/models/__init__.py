"""Model families, looked up by the checkpoint's ``config.json`` ``model_type`` (see ``omni_stream.engine``)."""
