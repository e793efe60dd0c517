"""The machinery every pass runs on: what a pass is (base), the registry and the ordered
pipelines (registry), the fixpoint engine (engine) and the records it returns (records).
Pass modules live in fuse_cli.passes; importing that package registers them."""
