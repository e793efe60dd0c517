"""Static analysis: tensor shapes with user-bound symbolic dims, and activation liveness."""
