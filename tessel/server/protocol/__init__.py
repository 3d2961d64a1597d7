"""OpenAI's wire format: request bodies, response bodies and the error shape."""
