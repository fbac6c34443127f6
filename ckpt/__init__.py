"""The checkpoint core: manifest + atomic commit + verify, training-state capture, the
DeepSpeed CheckpointEngine plug-in, resharding and export."""
