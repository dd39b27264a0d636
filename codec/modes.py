"""How a decoder writes into its output: store, add or subtract (shared by stages and kernels)."""

SET, ADD, SUB = 0, 1, 2
