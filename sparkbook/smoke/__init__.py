"""06's work: the API's smoke test, its prompts, the burn-in and the known answers."""
