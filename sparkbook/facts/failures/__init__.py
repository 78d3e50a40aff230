"""The known failures by kind, one module each (container and platform, resources, fabric, the
engine); sparkbook.facts.known_failures puts them in the order a log is matched in.

Standard library only.
"""
