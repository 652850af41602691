"""lagom.orchestration: see docs/architecture.md."""
