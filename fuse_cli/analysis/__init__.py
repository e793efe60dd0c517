"""Static analysis of a model: tensor shapes with user-bound symbolic dims, and activation liveness."""
