"""Calls out to OpenAI-compatible endpoints (the judge, the teacher): one client with preflight, error
classification, a token bucket, a concurrency cap and retries, on its own event loop thread."""
