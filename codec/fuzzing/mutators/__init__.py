"""The structure-aware mutators, one per target, and the byte-level edits they share."""
