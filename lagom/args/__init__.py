"""lagom.args: see docs/architecture.md."""
