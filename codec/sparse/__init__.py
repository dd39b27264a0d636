"""Select stages: which elements a frame carries (top-k, AdaComp, ... join here)."""
