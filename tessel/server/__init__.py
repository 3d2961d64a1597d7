"""The OpenAI-compatible HTTP server: FastAPI routes over ``engine.AsyncEngine``.

Imports the engine and config; nothing below it imports this package.
"""
