"""KV-cache events in vLLM 0.33's wire format: codec, transport and a consumer index."""
