"""Every rule about a request's content, checked once, by the engine, before the request's pipeline runs.

Each pipeline resolves its request type (:attr:`omni_stream.pipeline_specs.PipelineSpec.resolve`): defaults filled
in from the loaded models, then checked against them; an invalid request raises
:class:`~omni_stream.errors.InvalidRequestError` naming the field (as the wire spells it) and the allowed values, before
anything streams. The serving layer parses the wire (types, shapes, enums) and maps these errors to its protocol's
error shape; families receive resolved requests and check none of this again. One place per rule:

- voices, built-in and uploaded (a :class:`~omni_stream.validation.voices.VoiceCatalog` the engine is given):
  :mod:`.voices`;
- languages: :mod:`.language`;
- speech tasks, cloning references and a speech request as a whole: :mod:`.speech` (its bounds: the one copy in
  :mod:`omni_stream.speech.limits`);
- ``max_tokens`` and the prompt fitting the context, for every text backend, and a spoken reply: :mod:`.text`;
- sampling fields to and from OpenAI's words (clients, vLLM, remote servers): :mod:`.sampling`;
- images and video: :func:`omni_stream.images.spec.check_request`, :func:`omni_stream.video.spec.resolve_request`.
"""
