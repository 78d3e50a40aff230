"""What the node tools print, read: each tool's parser with its type (inventory, model
manifests, memory fit, log signatures), beside the script of the same stem in ``scripts/``."""
