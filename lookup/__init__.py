"""HTTP and Redis lookups: ready AsyncFunctions for the keyed async wait operator."""
