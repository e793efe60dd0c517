"""What pass authors share, so no pass imports another: shape proofs (shapes), normalization
helpers (norms), per-channel weight arithmetic (conv_weights), activation helpers (activations),
attention head splits (heads), a decoder's attention patterns (attention_forms) and their proofs
(attention_proofs), keeping a fused output's dims as unnamed to onnxruntime's planner as the
subgraph it replaced (runtime_shapes), the rotate-half rotary pattern and proofs (rotary): one copy serves the
com.microsoft passes and the standard opset-23 ones. The matcher is fuse_cli.match; a check
declines with fuse_cli.pipeline.base.Decline."""
