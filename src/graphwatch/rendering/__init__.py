"""Rendering: terminal summary (rich), DOT/SVG snapshots, HTML report, JSON (see graphwatch.model)."""
