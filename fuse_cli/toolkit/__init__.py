"""What pass authors share, so no pass imports another: shape proofs (shapes), normalization
helpers (norms), per-channel weight arithmetic (conv_weights) and activation helpers
(activations). The matcher is fuse_cli.match; a check declines with fuse_cli.pipeline.base.Decline."""
