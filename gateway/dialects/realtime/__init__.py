"""`/v1/realtime`: OpenAI's Realtime API over a WebSocket, made of this server's own workers:
Silero VAD finds the turns, Whisper writes them down, the chat model answers, Piper speaks the
answer a sentence at a time (docs/realtime.md)."""
