"""The stream core: append (group commit), read, tail, ephemeral events, retention."""
