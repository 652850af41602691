"""lagom.reports: see docs/architecture.md."""
