"""Test helpers shared by the tiers (servers the tests start)."""
