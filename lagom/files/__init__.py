"""lagom.files: see docs/architecture.md."""
