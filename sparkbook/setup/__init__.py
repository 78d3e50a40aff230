"""Day one: from "cabled, SSH works" to a parameters file (discover, draft)."""
