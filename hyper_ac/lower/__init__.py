"""Apply the core's plan to FX, split forward/backward, compile (torch.compile backend)."""
