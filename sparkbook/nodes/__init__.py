"""Reaching the nodes: commands over SSH in parallel (remote), what reaches their shell (shell),
host keys, the private working folder, the one-run-at-a-time lock, and a private sshd."""
