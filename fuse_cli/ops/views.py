"""Reshape, Flatten, Squeeze, Unsqueeze and Identity (standard): kernels whose output 0 is a view
of input 0 (KernelDefBuilder().Alias(0, 0)): no bytes of their own."""

from __future__ import annotations

from fuse_cli.ops.record import Operator

RECORDS = tuple(Operator(op, view_opsets=(1, 10**6))
                for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"))
