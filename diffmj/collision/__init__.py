"""Collision detection: broad phase plan, narrow-phase pair functions, contact assembly."""
