"""Text generation on any OpenAI-compatible server (family ``openai``); see :mod:`.family`."""
