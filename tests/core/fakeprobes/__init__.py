"""Probe modules with scripted behaviour, to exercise the real runner."""
