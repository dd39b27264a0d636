"""The oracles, one per parser, and the comparisons they share."""
