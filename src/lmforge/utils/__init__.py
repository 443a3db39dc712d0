"""Small shared helpers (atomic file writes, device/precision choice)."""
