"""POST /v1/audio/transcriptions: OpenAI's speech-to-text route over the loaded transcription model."""
