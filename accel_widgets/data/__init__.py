"""The dataset plumbing the data knobs switch: caches, shards, stream splitting, item layouts, fingerprints."""
