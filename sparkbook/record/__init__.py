"""The record of runs: the fingerprint, report.html, compare.html, the status of a deployment,
the bug report, and the readers of received run folders (bounded, sanitised)."""
