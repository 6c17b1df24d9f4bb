"""Example applications built on deadman (not shipped in the wheel)."""
