"""Replays of the billing incident: the README's main command."""
