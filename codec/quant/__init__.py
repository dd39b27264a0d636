"""Value stages: how kept values are coded (exactly, fp16, bf16; quantizers join here)."""
