"""POST /v1/audio/transcriptions and /v1/audio/translations: OpenAI's speech-to-text routes over the loaded
transcription model."""
