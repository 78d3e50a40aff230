"""What every step shows and keeps: checks and verdicts, tables, progress, the errors shown to
people, secrets masked, the step face, and judging times by their samples. The bottom layer:
it imports nothing else of sparkbook."""
